"""The Batch-API path of the critic: write a round's requests as a JSONL, ingest the answers.

OpenAI's Batch API answers a JSONL of requests within a day at half the price. drlc uses
it as another way to fill the critic cache:

1. :func:`batch_prepare` writes one line per request whose answer is not cached yet, with
   ``custom_id`` = the cache key of the given :class:`~pipeline.critic.client.CriticClient`
   (its model, sampling parameters, template SHA-256 and namespace; no endpoint URL, so
   the answers serve a live round against any server of the same model);
2. the file is uploaded and run outside drlc (``openai`` CLI or web console);
3. :func:`batch_ingest` stores every complete successful answer of the output JSONL under
   its ``custom_id``, in the value layout the client stores.

The next live round then finds every answer in the cache and sends nothing. Which rollouts
are critiqued and what is sent for them is decided by
:func:`pipeline.critic.annotate.round_requests`, the function the live round uses.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from pipeline.core.atomic import write_text
from pipeline.core.cache import CriticCache
from pipeline.core.errors import DataError
from pipeline.core.jsonl import json_object
from pipeline.critic.annotate import round_requests
from pipeline.critic.client import CriticClient

__all__ = ["BATCH_URL", "batch_prepare", "batch_ingest", "round_requests"]

BATCH_URL = "/v1/chat/completions"
_CACHE_KEY = re.compile(r"^[0-9a-f]{64}$")


def batch_prepare(requests: list[list[dict]], *, client: CriticClient, cache: CriticCache,
                  out_path: str | Path, sample_index: int = 0) -> int:
    """Write a Batch-API input JSONL with one line per request not already answered in the cache.

    Each line is ``{"custom_id": <cache key>, "method": "POST", "url": "/v1/chat/completions",
    "body": {<critic.extra_body>, "model": ..., "messages": ..., <sampling>}}``, the body being exactly what the
    client sends and the key exactly :meth:`CriticClient.key_for`. Identical requests get one
    line (a batch needs unique ids). The file is written atomically; with nothing to ask it
    is still written, empty. The client sends nothing here.

    :param requests: one chat message list per request, e.g. from :func:`round_requests`
    :param client: the client a live round would use (e.g. ``critic_client(critic, None, ...)``)
    :param cache: the critic cache; requests it already answers are left out
    :param out_path: the JSONL to write
    :param sample_index: sample index put into every cache key, as in ``CriticClient.run``
    :return: number of lines written
    """
    lines: dict[str, str] = {}
    for messages in requests:
        key = client.key_for(messages, sample_index)
        if key in lines or key in cache:
            continue
        line = {"custom_id": key, "method": "POST", "url": BATCH_URL,
                "body": {**client.extra_body, "model": client.model, "messages": messages, **client.sampling}}
        lines[key] = json.dumps(line, ensure_ascii=False, separators=(",", ":"))
    write_text(out_path, "".join(f"{line}\n" for line in lines.values()))
    return len(lines)


def batch_ingest(results_path: str | Path, *, cache: CriticCache) -> dict:
    """Store the successful answers of a Batch-API output JSONL in the critic cache.

    An answer is stored when its line has ``response.status_code`` 200, non-empty content
    and ``finish_reason`` "stop"; the value is the client's layout (raw_text,
    finish_reason, usage, model, system_fingerprint, latency_s = 0.0, since a batch has no
    per-request latency). Anything else (an ``error`` object, another status, empty or
    truncated content) is counted as failed and never stored, so a live run retries it.
    The whole file is checked before anything is stored.

    :param results_path: the output JSONL the Batch API returned
    :param cache: the critic cache to fill
    :return: ``{"ingested": newly stored, "failed": not stored, "skipped": already cached}``
    :raises DataError: if the file is unreadable, or a line is not JSON, lacks a 64-hex
        ``custom_id``, or has a 200 body that is not a chat completion (names file and line)
    """
    path = Path(results_path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise DataError(f"cannot read Batch-API output {str(path)!r} ({error}); "
                        "pass the output file the batch produced") from error
    answers = [_answer_of_line(path, number, line)
               for number, line in enumerate(text.splitlines(), start=1) if line.strip()]
    counts = {"ingested": 0, "failed": 0, "skipped": 0}
    for key, value in answers:
        if value is None:
            counts["failed"] += 1
        elif cache.put(key, value):
            counts["ingested"] += 1
        else:
            counts["skipped"] += 1
    return counts


def _answer_of_line(path: Path, number: int, line: str) -> tuple[str, dict | None]:
    """Return (custom_id, cache value) of one output line; the value is None for a failed request."""
    where = f"{path}:{number}"
    record = json_object(where, line, expected="a JSON object (a Batch-API output has one per line)")
    key = record.get("custom_id")
    if not isinstance(key, str) or not _CACHE_KEY.match(key):
        raise DataError(f"{where}: custom_id {key!r} is not a drlc cache key (64 hex digits); "
                        "ingest only outputs of files written by batch_prepare")
    response = record.get("response")
    if not isinstance(response, dict) or response.get("status_code") != 200:
        return key, None
    body = response.get("body")
    try:
        choice = body["choices"][0]
        content, finish_reason = choice["message"].get("content"), choice.get("finish_reason")
        usage = {"prompt_tokens": int(body["usage"]["prompt_tokens"]),
                 "completion_tokens": int(body["usage"]["completion_tokens"])}
    except (TypeError, KeyError, IndexError, ValueError, AttributeError):
        raise DataError(f"{where}: status 200 but the body is not a chat completion with choices[0].message "
                        "and usage; is this a chat-completions batch?") from None
    if not isinstance(content, str) or not content.strip() or finish_reason != "stop":
        return key, None
    return key, {"raw_text": content, "finish_reason": finish_reason, "usage": usage,
                 "model": body.get("model") or "", "system_fingerprint": body.get("system_fingerprint") or None,
                 "latency_s": 0.0}

