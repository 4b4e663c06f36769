"""Structured critic answers (``critic.answer_format``): a JSON schema of labelled spans, how it is asked for, how it is read.

``text`` (the default) is drlc's free-text answer, read by :mod:`pipeline.critic.parse`.
``json`` and ``copy`` ask for one JSON object::

    {"spans": [{"label": "toxic", "text": "you absolute clown"}]}

with ``label`` one of the template's labels and at most :data:`MAX_SPANS` spans:

- ``json`` sends the schema as OpenAI's strict ``response_format`` (``json_schema``), which
  OpenAI, SGLang and drlc's own server honour;
- ``copy`` also restricts every span's ``text`` to a substring of the response: drlc's
  server decodes under that constraint (its ``drlc_copy`` body field, see
  :mod:`pipeline.critic.offline.constrained`), and llama.cpp-style servers get the same
  constraint as a GBNF ``grammar`` (:mod:`pipeline.critic.grammar`). No ``response_format``
  is sent with ``copy``: llama.cpp's server answers the ``json_schema`` type with HTTP 500;
- ``copy_words`` is ``copy`` with spans that start and end at word edges
  (:func:`pipeline.critic.grammar.span_bounds`), so a span cannot be a stray letter or half a
  word.

These are the canonical bodies; the client rewrites them for the server it talks to (vLLM's
``structured_outputs``, SGLang's ``ebnf``: :mod:`pipeline.critic.servers`, ``critic.server``).

Either way the last user message gets one more paragraph asking for the structure in words
(:func:`instruction`), so an endpoint that ignores the schema usually still complies. The
request fields are part of the cache key (they go through the client's per-request body).

:func:`read_structured` reads an answer: the JSON object if the answer is one (code fences
allowed), else the free-text parser as a fallback; an answer that is neither is
``parse_error`` with the JSON error, never silently empty.
"""

from __future__ import annotations

import json
import re

from pipeline.core.config import CRITIC_ANSWER_FORMATS as ANSWER_FORMATS
from pipeline.core.errors import ConfigError
from pipeline.critic.grammar import CLOSE, ITEM_CLOSE, ITEM_MID, ITEM_OPEN, OPEN, SEPARATOR
from pipeline.critic.items import Item, canonical
from pipeline.critic.parse import ParsedAnswer, parse_answer

__all__ = ["ANSWER_FORMATS", "MAX_SPANS", "MIN_SPAN_BYTES", "answer_bound", "bounded_body", "schema_bound", "SCHEMA_NAME", "check_format", "instruction", "read_structured",
           "request_body", "requested_span_limit", "shape_requests", "span_schema", "spans_json", "with_instruction"]

MAX_SPANS = 8
"""Most spans one structured answer may hold (the schema's ``maxItems``)."""
MIN_SPAN_BYTES = 16
"""Shortest span length :func:`answer_bound` gives each span before it allows one span fewer (a few words)."""
SCHEMA_NAME = "critic_spans"
_FENCE = re.compile(r"^```\w*\s*|\s*```$")


def check_format(answer_format: str) -> str:
    """Return ``answer_format``; raise a one-line ConfigError naming the key if it is unknown."""
    if answer_format not in ANSWER_FORMATS:
        raise ConfigError(f"critic.answer_format {answer_format!r} is unknown; use one of {list(ANSWER_FORMATS)}")
    return answer_format


def answer_bound(labels, max_tokens: int) -> tuple[int, int]:
    """(most spans, most UTF-8 bytes of one span's text) so that the longest constrained answer closes within ``max_tokens``.

    Every token of a completion carries at least one byte of its text (byte-level vocabularies
    such as SmolLM2's hold all 256 bytes, so a decoder may spell any text byte by byte), so an
    answer of B bytes is at most B tokens, whatever the tokenizer; one more token is kept for
    the end of sequence (a server that stops at ``max_tokens`` reports ``length`` even when the
    object is closed). The answer's layout is fixed (:mod:`pipeline.critic.grammar`):
    ``{"spans": [`` ... ``]}`` (13 bytes), per span ``{"label": "<label>", "text": "`` ... ``"}``
    (25 bytes and the longest label) and ``, `` between spans (2). The most spans is the
    largest count up to :data:`MAX_SPANS` that leaves each span at least :data:`MIN_SPAN_BYTES`,
    else 1; the span length is what that count leaves.

    >>> answer_bound(["toxic"], 128)  # 127 bytes: 2 spans of 26: 13 + 2 * (30 + 26) + 2 = 127
    (2, 26)

    :raises ConfigError: (one line) when ``max_tokens`` cannot hold even one span of one byte
    """
    label = max(len(str(x).encode()) for x in labels)
    budget = max_tokens - 1 - len(OPEN + CLOSE) + len(SEPARATOR)  # each span then costs its separator
    per_span = len(ITEM_OPEN + ITEM_MID + ITEM_CLOSE + SEPARATOR) + label
    fits = [n for n in range(1, MAX_SPANS + 1) if budget // n - per_span >= MIN_SPAN_BYTES]
    spans = max(fits, default=1)
    length = budget // spans - per_span
    if length < 1:
        least = 1 + len(OPEN + CLOSE) + len(ITEM_OPEN + ITEM_MID + ITEM_CLOSE) + label + 1
        raise ConfigError(f"critic.max_tokens {max_tokens} cannot hold one constrained span (critic.answer_format "
                          f"json/copy/copy_words needs at least {least}): raise critic.max_tokens")
    return spans, length


def bounded_body(body: dict, max_tokens: int | None) -> dict:
    """A canonical constrained ``body`` (:func:`request_body`) bounded by :func:`answer_bound` for ``max_tokens``.

    A body without a constraint, or ``max_tokens`` None, is returned as it is. The bound is part
    of the body, so of the cache key: answers cached under the unbounded constraint are not reused.
    """
    if max_tokens is None:
        return body
    copy, response_format = body.get("drlc_copy"), body.get("response_format")
    if copy is not None and "max_span_bytes" not in copy:
        spans, length = answer_bound(copy["labels"], max_tokens)
        fmt = "copy_words" if copy.get("words") else "copy"
        return {name: value for name, value in body.items() if name not in ("grammar", "drlc_copy")} | \
            request_body(fmt, copy["labels"], source=copy["source"], max_spans=spans, max_span_bytes=length)
    if response_format is not None and response_format.get("type") == "json_schema":
        labels, _, length = schema_bound(response_format)
        if length is None:
            spans, length = answer_bound(labels, max_tokens)
            return body | request_body("json", labels, source="", max_spans=spans, max_span_bytes=length)
    return body


def schema_bound(response_format: dict) -> tuple[list[str], int, int | None]:
    """(labels, most spans, most characters of a span's text or None) of drlc's span ``json_schema`` response_format.

    The one reader of the schema :func:`span_schema` writes (the checks in :mod:`pipeline.critic.servers`,
    the hf backend's automaton).

    :raises KeyError, TypeError: for a schema not of drlc's span shape
    """
    spans = response_format["json_schema"]["schema"]["properties"]["spans"]
    labels = list(spans["items"]["properties"]["label"]["enum"])
    return labels, int(spans.get("maxItems", MAX_SPANS)), spans["items"]["properties"]["text"].get("maxLength")


def span_schema(labels, max_spans: int = MAX_SPANS, max_span_chars: int | None = None) -> dict:
    """The JSON schema of a structured answer for ``labels`` (strict: no other keys).

    ``max_span_chars`` (the answer bound) adds ``minLength`` 1 and ``maxLength`` to the span text.

    >>> span_schema(["toxic"])["properties"]["spans"]["items"]["properties"]["label"]
    {'type': 'string', 'enum': ['toxic']}
    """
    labels = [str(label) for label in labels]
    if not labels or max_spans < 1:
        raise ConfigError(f"a span schema needs labels and max_spans >= 1, got {labels!r} and {max_spans}")
    item = {"type": "object", "additionalProperties": False, "required": ["label", "text"],
            "properties": {"label": {"type": "string", "enum": labels}, "text": {"type": "string"}}}
    if max_span_chars is not None:
        item["properties"]["text"] |= {"minLength": 1, "maxLength": max_span_chars}
    return {"type": "object", "additionalProperties": False, "required": ["spans"],
            "properties": {"spans": {"type": "array", "items": item, "maxItems": max_spans}}}


def instruction(labels, *, answer_format: str, max_spans: int = MAX_SPANS) -> str:
    """The paragraph that asks for the JSON structure in words (drlc's own wording)."""
    shown = " or ".join(json.dumps(str(label)) for label in labels)
    source = {"copy": "a part of the text, copied character for character",
              "copy_words": "one or more whole words of the text, copied character for character",
              }.get(answer_format, "the span, copied from the text")
    return (f"Answer format for this reply: instead of the lines described above, write one JSON object and "
            f'nothing else, of the form {{"spans": [{{"label": <label>, "text": <span>}}]}}, where <label> is '
            f"{shown} and <span> is {source}. List at most {max_spans} spans; when there is none, write "
            f'{{"spans": []}}.')


def with_instruction(messages: list[dict], text: str) -> list[dict]:
    """``messages`` with ``text`` appended, after a blank line, to the last user message (a new list)."""
    out = [dict(m) for m in messages]
    last = max((i for i, m in enumerate(out) if m.get("role") == "user"), default=None)
    if last is None or not isinstance(out[last].get("content"), str):
        raise ConfigError("critic.answer_format json/copy needs a user message with text content in the template")
    out[last]["content"] = f"{out[last]['content'].rstrip()}\n\n{text}"
    return out


def request_body(answer_format: str, labels, *, source: str, max_spans: int = MAX_SPANS,
                 max_span_bytes: int | None = None) -> dict:
    """The extra request fields for one critic request in ``answer_format`` ({} for ``text``).

    :param source: the text spans are copied from (the critiqued response), used by ``copy``
    :param max_span_bytes: the answer bound's span length (:func:`answer_bound`); None: unbounded (the
        bodies, and cache keys, of drlc before the bound). ``json`` takes it as the text's ``maxLength``
        in characters (a non-ASCII character may cost more than one token: the one gap of the bound)
    """
    check_format(answer_format)
    if answer_format == "text":
        return {}
    schema = span_schema(labels, max_spans, max_span_bytes)
    if answer_format == "json":
        return {"response_format": {"type": "json_schema",
                                    "json_schema": {"name": SCHEMA_NAME, "strict": True, "schema": schema}}}
    from pipeline.critic.grammar import copy_grammar

    words = answer_format == "copy_words"
    copy = {"source": source, "labels": [str(label) for label in labels], "max_spans": max_spans} | \
        ({"words": True} if words else {}) | ({} if max_span_bytes is None else {"max_span_bytes": max_span_bytes})
    return {"grammar": copy_grammar(source, labels, max_spans=max_spans, words=words, max_span_bytes=max_span_bytes),
            "drlc_copy": copy}  # copy's bodies (and cache keys) as before


def shape_requests(requests: list[list[dict]], sources: list[str], *, labels,
                   answer_format: str) -> tuple[list[list[dict]], list[dict]]:
    """Rendered requests as ``answer_format`` sends them: (messages with the instruction, body fields).

    ``text`` returns the requests unchanged and empty bodies, so its cache keys are today's.

    :param sources: per request, the critiqued response (what ``copy`` spans are copied from)
    """
    check_format(answer_format)
    if answer_format == "text":
        return requests, [{} for _ in requests]
    line = instruction(labels, answer_format=answer_format)
    return ([with_instruction(messages, line) for messages in requests],
            [request_body(answer_format, labels, source=source) for source in sources])


def requested_span_limit(request: dict) -> int | None:
    """The most spans a chat-completions body asks for as a structured answer; None for a free-text one.

    Used by drlc's own backends that write spans they already know (lexicon, tagger): ``copy``'s
    ``drlc_copy`` field, else a ``json_schema`` ``response_format``.

    >>> requested_span_limit({"drlc_copy": {"max_spans": 3}}), requested_span_limit({"messages": []})
    (3, None)
    """
    copy = request.get("drlc_copy")
    if copy is not None:
        return int(copy.get("max_spans", MAX_SPANS))
    response_format = request.get("response_format") or {}
    if response_format.get("type") != "json_schema":
        return None
    return schema_bound(response_format)[1]


def spans_json(spans, limit: int) -> str:
    """A structured answer holding the first ``limit`` of ``spans`` ((label, text) pairs).

    >>> spans_json([("toxic", "clown"), ("toxic", "fool")], 1)
    '{"spans": [{"label": "toxic", "text": "clown"}]}'
    """
    return json.dumps({"spans": [{"label": label, "text": text} for label, text in list(spans)[:limit]]},
                      ensure_ascii=False)


def read_structured(text: str, *, labels, leading_label: str | None = None) -> ParsedAnswer:
    """Read a structured answer; fall back to :func:`pipeline.critic.parse.parse_answer`.

    ``{"spans": []}`` is ``none``; an answer that is neither the JSON object nor free text
    with items is ``parse_error`` and its error names the JSON problem.
    """
    labels = tuple(str(label).strip().lower() for label in labels)
    stripped = _FENCE.sub("", (text or "").strip())
    try:
        data = json.loads(stripped)
    except ValueError as error:
        fallback = parse_answer(text, labels=labels, leading_label=leading_label)
        if fallback.status != "parse_error":
            return fallback
        return ParsedAnswer("parse_error", (), f"not valid JSON ({error}); free-text reading found no item either")
    spans = data.get("spans") if isinstance(data, dict) else None
    if not isinstance(spans, list):
        return ParsedAnswer("parse_error", (), 'JSON answer has no "spans" list')
    items = []
    for entry in spans:
        if not isinstance(entry, dict) or not isinstance(entry.get("text"), str) or not entry["text"].strip():
            continue
        label = canonical(str(entry.get("label", "")), labels)
        items.append(Item(label, entry["text"], (entry["text"],)))
    unique = tuple(dict.fromkeys(items))
    if unique:
        return ParsedAnswer("ok", unique, "")
    if spans:
        return ParsedAnswer("parse_error", (), f'JSON answer has {len(spans)} span(s) but none with a "text" string')
    return ParsedAnswer("none", (), "")
