"""One round of critic annotations: pick low-reward rollouts, ask the critic, align its spans.

:func:`annotate_round` turns rollout rows into rows of the ``annotations`` table. Rollouts
whose environment reward is at or below the threshold are rendered with the critic
template and sent through :class:`~pipeline.critic.client.CriticClient` (cache first,
identical requests once); each answer is parsed and its spans are aligned to response
tokens: the critic's intrinsic reward of each response token, stored in the ``token_rewards``
column. Every other rollout gets a ``skipped`` row with all-zero intrinsic rewards, so the
output has exactly one row per input row, in input order.

Status of a row (``STATUSES``), honest about what the answer gave:

- ``ok``: at least one span was kept and aligned;
- ``none``: the answer explicitly names nothing ("None identified");
- ``no_match``: items were read, but none was kept (each is in ``dropped`` with its
  reason: not in the response, only in the source document, a label without a reward);
- ``parse_error``: the answer has content but no item could be read;
- ``api_error``, ``truncated`` (``finish_reason == "length"``), ``budget``: from the client,
  passed through with no spans;
- ``skipped``: not sent to the critic.

Each critiqued row records the ``items`` read, the kept ``spans`` (one per aligned
occurrence), the ``dropped`` items with reasons, and ``attempts`` (HTTP attempts in this
run; 0 for a cache hit and for a repeat of a request already sent in the round, so the
round's ``sum(attempts)`` is its ``critic_requests``).

With ``zero_mean`` (``critic.zero_mean``) each critiqued response's aligned intrinsic rewards
get their own mean subtracted, so they sum to zero: the critic then moves credit between a
response's tokens without adding or removing reward in total. It is post-processing of the
cached answer, so cache keys do not depend on it and a replay can switch it.

``placement`` (``critic.placement``, :func:`placed_rewards`) says where a response's span rewards go,
also after the cache (the same answers serve every placement, so a study's arms share one cache):
``tokens`` on the tokens the spans cover (drlc); ``summed`` all of them summed onto the response's last
token, i.e. added to the env reward there, which is what a TRL or verl user gets from the same critic;
``random`` the same spans (count, labels, word lengths) moved to random words of the response
(:mod:`pipeline.critic.offline.random_spans`, seeded by the response text): the control that keeps the
critic's reward amount and removes *which* tokens it marks, for any critic backend.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pipeline.core.cache import CriticCache
from pipeline.core.errors import ConfigError, DataError
from pipeline.critic.align import align_located, align_spans, match_items
from pipeline.critic.client import CriticClient, CriticResult
from pipeline.critic.parse import parse_answer
from pipeline.critic.structured import read_structured, shape_requests
from pipeline.critic.vote import majority, vote_spans

__all__ = ["ANNOTATION_FIELDS", "STATUSES", "ReadAnswer", "annotate_round", "critiqued_indices", "fields_for",
           "placed_rewards", "read_answer", "summed_rewards", "response_fields", "round_requests", "sampled_results",
           "zero_mean_rewards"]

ANNOTATION_FIELDS = (
    "rollout_id", "critiqued", "status", "cache_key", "cache_hit", "critic_model", "template_sha",
    "raw_text", "items", "spans", "dropped", "token_rewards", "prompt_tokens", "completion_tokens", "cost_usd",
    "attempts", "error",
)
STATUSES = ("ok", "none", "no_match", "parse_error", "api_error", "truncated", "budget", "skipped")
_ROLLOUT_FIELDS = ("rollout_id", "response", "response_ids", "env_reward")


def _check_rows(rows: list[dict]) -> None:
    for index, row in enumerate(rows):
        missing = [name for name in _ROLLOUT_FIELDS if name not in row]
        if missing:
            raise DataError(f"rollout row {index} lacks {missing}; rollouts need {list(_ROLLOUT_FIELDS)}")


def critiqued_indices(rows: list[dict], *, threshold: float) -> list[int]:
    """Return the positions of the rows sent to the critic: ``env_reward <= threshold``, both in the task's units
    (the scores table's env_reward, before score.scale and score.normalize: the same rows at any scale).

    :raises DataError: if a row lacks a rollout field
    """
    _check_rows(rows)
    return [i for i, row in enumerate(rows) if float(row["env_reward"]) <= threshold]


def response_fields(row: dict) -> dict[str, str]:
    """The placeholder values of a template whose only placeholder is ``{response}``."""
    return {"response": row["response"]}


def fields_for(template, fields=None):
    """`fields` when given (a task's ``critic_fields``), else :func:`response_fields` for a template
    that asks for the response alone.

    :raises ConfigError: if the template has other placeholders and no `fields` was given
    """
    if fields is not None:
        return fields
    if tuple(template.placeholders) == ("response",):
        return response_fields
    raise ConfigError(f"{template.path}: placeholders {list(template.placeholders)} need the task's critic fields; "
                      "pass fields=pipeline.tasks.get_task(task).critic_fields")


def round_requests(rows: list[dict], *, template, threshold: float, fields=None) -> list[list[dict]]:
    """Return the critic requests of one round: the template rendered for each critiqued row.

    The one place that decides which rollouts are critiqued and what is sent for them;
    :func:`annotate_round` and the Batch-API path (:mod:`pipeline.critic.batch`) both use it,
    so a batch prepared from the same rows fills exactly the cache keys a live round reads.

    :param rows: rollouts with rollout_id, response, response_ids and env_reward
    :param template: a loaded critic template (``pipeline.critic.templates.Template``)
    :param threshold: environment reward at or below which a rollout is critiqued
    :param fields: row -> placeholder values (the task's ``critic_fields``); default: :func:`fields_for`
        (sentiment/toxicity: the response; summarization: document, summary and score)
    :return: one chat message list per critiqued row, in row order (duplicates kept)
    :raises DataError: if a row lacks a rollout field
    """
    fields = fields_for(template, fields)
    return [template.render(fields(rows[i])) for i in critiqued_indices(rows, threshold=threshold)]


def skipped_row(row: dict) -> dict:
    """The annotation of a response not sent to the critic: status skipped, zero intrinsic reward."""
    return {
        "rollout_id": row["rollout_id"], "critiqued": False, "status": "skipped", "cache_key": "",
        "cache_hit": False, "critic_model": "", "template_sha": "", "raw_text": "", "items": [], "spans": [],
        "dropped": [], "token_rewards": [0.0] * len(row["response_ids"]), "prompt_tokens": 0,
        "completion_tokens": 0, "cost_usd": 0.0, "attempts": 0, "error": "",
    }


def zero_mean_rewards(intrinsic_rewards: list[float]) -> list[float]:
    """Return ``intrinsic_rewards`` minus their mean, so they sum to zero.

    An all-zero list (a response with no span) stays all zero, an empty list stays empty.
    """
    if not intrinsic_rewards:
        return []
    mean = sum(intrinsic_rewards) / len(intrinsic_rewards)
    return [float(r) - mean for r in intrinsic_rewards]


@dataclass(frozen=True)
class ReadAnswer:
    """A critic answer read against its response: what :func:`_critiqued_row` records.

    Attributes:
        status: ``ok``, ``none``, ``no_match`` or ``parse_error`` (see the module docstring).
        items: ``{label, text}`` of every item read.
        kept: ``(label, text)`` of the items found in the response, to align.
        dropped: ``{label, text, reason}`` of the items not kept.
        error: why nothing was kept, or ``""``.
    """

    status: str
    items: list[dict]
    kept: list[tuple[str, str]]
    dropped: list[dict]
    error: str


def read_answer(raw_text: str, *, labels, leading_label: str | None, response: str, rewards: dict[str, float],
                elsewhere: dict[str, str] | None = None, answer_format: str = "text") -> ReadAnswer:
    """Parse a complete critic answer and decide which items are kept for ``response``.

    :param raw_text: the answer text (the client's status was ``ok``)
    :param labels: the template's span labels
    :param leading_label: the template's open-header label (``Template.leading_label``)
    :param response: the critiqued response text
    :param rewards: reward per label; an item whose label has none is dropped
    :param elsewhere: other texts shown to the critic by name (summarization: the document)
    :param answer_format: ``critic.answer_format``; json and copy answers are read as JSON first
        (:func:`pipeline.critic.structured.read_structured`)
    :return: a :class:`ReadAnswer`
    """
    read = parse_answer if answer_format == "text" else read_structured
    parsed = read(raw_text, labels=labels, leading_label=leading_label)
    items = [{"label": item.label, "text": item.text} for item in parsed.items]
    if parsed.status != "ok":
        return ReadAnswer(parsed.status, items, [], [], parsed.error)
    kept, dropped = match_items(parsed.items, response, rewards=rewards, elsewhere=elsewhere)
    if kept:
        return ReadAnswer("ok", items, kept, dropped, "")
    error = f"none of the {len(items)} item(s) was kept; first: {dropped[0]['text']!r} {dropped[0]['reason']}"
    return ReadAnswer("no_match", items, [], dropped, error)


def summed_rewards(intrinsic_rewards: list[float]) -> list[float]:
    """The response's token rewards summed onto its last token (placement ``summed``).

    >>> summed_rewards([0.5, 0.0, -0.5, 0.5])
    [0.0, 0.0, 0.0, 0.5]
    """
    if not intrinsic_rewards:
        return []
    return [0.0] * (len(intrinsic_rewards) - 1) + [float(sum(intrinsic_rewards))]


def _apart(located: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """The located spans in text order with any span that overlaps an earlier one left out."""
    kept, end = [], -1
    for label, start, stop in sorted(located, key=lambda span: (span[1], span[2])):
        if start >= end:
            kept.append((label, start, stop))
            end = stop
    return kept


def placed_rewards(row: dict, spans: list[dict], intrinsic_rewards: list[float], *, placement: str, tokenizer,
                   rewards: dict[str, float]) -> tuple[list[dict], list[float]]:
    """(spans, token rewards) of one answered response after ``critic.placement`` (see the module docstring).

    ``random`` moves the located spans (overlapping ones counted once) with
    :func:`~pipeline.critic.offline.random_spans.random_spans` and aligns them where they land (mode exact).
    """
    if placement == "summed":
        return spans, summed_rewards(intrinsic_rewards)
    if placement == "random":
        from pipeline.critic.offline.random_spans import random_spans

        located = _apart([(s["label"], s["start"], s["end"]) for s in spans if s["start"] >= 0])
        moved = random_spans(row["response"], located)
        aligned = align_located(response_text=row["response"], response_ids=list(row["response_ids"]),
                                tokenizer=tokenizer, located=moved, rewards=rewards, mode="exact")
        return [dict(span) for span in aligned.spans], [float(r) for r in aligned.intrinsic_rewards]
    return spans, intrinsic_rewards


def _critiqued_row(row: dict, result: CriticResult, *, template, tokenizer, rewards, alignment,
                   requested_model: str, zero_mean: bool = False, fields=None, answer_format: str = "text",
                   placement: str = "tokens") -> dict:
    """Build the annotation of one critiqued rollout from its critic result."""
    out = skipped_row(row) | {
        "critiqued": True, "status": result.status, "cache_key": result.cache_key,
        "cache_hit": result.cache_hit, "critic_model": result.model or requested_model,
        "template_sha": template.sha256, "raw_text": result.raw_text, "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens, "cost_usd": result.cost_usd,
        "attempts": int(result.attempts), "error": result.error,
    }
    if result.status != "ok":
        return out
    read = read_answer(result.raw_text, labels=template.labels, leading_label=template.leading_label,
                       response=row["response"], rewards=rewards,
                       elsewhere=_other_texts(row, fields_for(template, fields)), answer_format=answer_format)
    out |= {"status": read.status, "items": read.items, "dropped": read.dropped, "error": read.error}
    if read.status != "ok":
        return out
    aligned = align_spans(
        response_text=row["response"], response_ids=list(row["response_ids"]), tokenizer=tokenizer,
        spans=read.kept, rewards=rewards, mode=alignment,
    )
    assert len(aligned.intrinsic_rewards) == len(row["response_ids"]), "align_spans must return one reward per token"
    spans, intrinsic_rewards = placed_rewards(row, [dict(span) for span in aligned.spans],
                                              [float(r) for r in aligned.intrinsic_rewards], placement=placement,
                                              tokenizer=tokenizer, rewards=rewards)
    if zero_mean:
        intrinsic_rewards = zero_mean_rewards(intrinsic_rewards)
    return out | {"spans": spans, "token_rewards": intrinsic_rewards}


def sampled_results(client, requests, bodies, cache, *, samples: int, progress: bool) -> list[list[CriticResult]]:
    """Per request, its ``samples`` results (sample index s sent with seed s); the client's stats summed."""
    from pipeline.critic.client import RunStats

    per_sample, total = [], RunStats()
    for index in range(samples):
        seeded = [dict(body, seed=index) for body in bodies]
        per_sample.append(client.run(requests, cache, sample_index=index, progress=progress, bodies=seeded)
                          if requests else [])
        for name in ("requests_sent", "cache_hits", "retries", "failures", "truncated", "budget_stopped",
                     "cost_usd"):
            setattr(total, name, getattr(total, name) + getattr(client.last_stats, name))
    client.last_stats = total
    return [list(results) for results in zip(*per_sample)] if requests else []


def _voted_row(row: dict, results: list[CriticResult], *, template, tokenizer, rewards, alignment,
               requested_model: str, zero_mean: bool, fields, answer_format: str, vote_min: int,
               placement: str = "tokens") -> dict:
    """The annotation of a response critiqued ``len(results)`` times: its spans are the voted characters.

    ``raw_text`` is the JSON list of every sample's answer, ``cache_key`` their keys joined by
    ``,``, ``items`` and ``dropped`` the union over samples; the status is ``ok`` when a span
    survives the vote, ``budget`` when any sample was budget-stopped, ``none`` when answers
    named spans but no character reached ``vote_min``, else the samples' most common status.
    """
    samples = [_critiqued_row(row, result, template=template, tokenizer=tokenizer, rewards=rewards,
                              alignment=alignment, requested_model=requested_model, fields=fields,
                              answer_format=answer_format) for result in results]
    marks = [[(s["label"], s["start"], s["end"]) for s in sample["spans"] if s["start"] >= 0] for sample in samples]
    voted = vote_spans(marks, vote_min=vote_min)
    statuses = [sample["status"] for sample in samples]
    out = samples[0] | {
        "cache_key": ",".join(sample["cache_key"] for sample in samples),
        "cache_hit": all(sample["cache_hit"] for sample in samples),
        "raw_text": json.dumps([sample["raw_text"] for sample in samples], ensure_ascii=False),
        "items": _union(sample["items"] for sample in samples),
        "dropped": _union(sample["dropped"] for sample in samples),
        **{name: sum(sample[name] for sample in samples)
           for name in ("prompt_tokens", "completion_tokens", "cost_usd", "attempts")},
        "spans": [], "token_rewards": [0.0] * len(row["response_ids"]),
    }
    if "budget" in statuses:
        return out | {"status": "budget", "error": next(s["error"] for s in samples if s["status"] == "budget")}
    if not voted:
        status = "none" if "ok" in statuses else max(STATUSES, key=statuses.count)
        error = (f"no character was marked by {vote_min} of {len(samples)} answers (critic.vote_min)"
                 if status == "none" and "ok" in statuses else next((s["error"] for s in samples if s["error"]), ""))
        return out | {"status": status, "error": error}
    aligned = align_located(response_text=row["response"], response_ids=list(row["response_ids"]),
                            tokenizer=tokenizer, located=voted, rewards=rewards, mode=alignment)
    spans, intrinsic_rewards = placed_rewards(row, [dict(span) for span in aligned.spans],
                                              [float(r) for r in aligned.intrinsic_rewards], placement=placement,
                                              tokenizer=tokenizer, rewards=rewards)
    if zero_mean:
        intrinsic_rewards = zero_mean_rewards(intrinsic_rewards)
    return out | {"status": "ok", "error": "", "spans": spans, "token_rewards": intrinsic_rewards}


def _union(lists) -> list[dict]:
    """The dicts of every list, first occurrence kept, in order."""
    seen, out = set(), []
    for entries in lists:
        for entry in entries:
            key = tuple(sorted(entry.items()))
            if key not in seen:
                seen.add(key)
                out.append(entry)
    return out


def _other_texts(row: dict, fields) -> dict[str, str]:
    """The texts other than the response shown to the critic (summarization: the document, not the score)."""
    response = row["response"].strip()
    return {name: value for name, value in fields(row).items()
            if value.strip() != response and any(ch.isalpha() for ch in value)}


def annotate_round(rows: list[dict], *, template, tokenizer, client: CriticClient, cache: CriticCache,
                   threshold: float, rewards: dict[str, float], alignment: str,
                   progress: bool = True, fields=None, zero_mean: bool = False,
                   answer_format: str = "text", samples: int = 1, vote_min: int | None = None,
                   placement: str = "tokens") -> list[dict]:
    """Critique the low-reward rollouts of one round and return one annotation per rollout.

    A row is critiqued when ``env_reward <= threshold``; its request is the template
    rendered with ``fields(row)`` (see :func:`round_requests`). The result is deterministic for the
    same rows, template, client settings and cache contents. Only ``ok`` rows carry
    non-zero intrinsic rewards (``token_rewards``); a failed or budget-stopped request is recorded, not raised
    (see the module docstring for the statuses).

    :param rows: rollouts with rollout_id, response, response_ids and env_reward
    :param template: a loaded critic template (``pipeline.critic.templates.Template``)
    :param tokenizer: the policy tokenizer that produced ``response_ids``
    :param client: the critic client
    :param cache: the critic cache
    :param threshold: environment reward at or below which a rollout is critiqued
    :param rewards: span label -> per-token reward (e.g. {"positive": 1.0, "negative": -1.0})
    :param alignment: span-to-token alignment mode, passed to ``align_spans``
    :param progress: show a tqdm bar over critic requests
    :param fields: row -> placeholder values, as in :func:`round_requests`
    :param zero_mean: subtract each critiqued response's mean intrinsic reward (:func:`zero_mean_rewards`);
        skipped and failed rows stay all zero either way
    :param answer_format: ``critic.answer_format`` (text, json, copy, copy_words): how requests ask and answers are read
    :param samples: ``critic.samples``: answers per critiqued response (sample indices 0..k-1, each cached
        on its own, each sent with ``seed`` = its index); more than one are voted (:func:`_voted_row`)
    :param vote_min: ``critic.vote_min``: answers that must mark a character (None: a majority)
    :param placement: ``critic.placement``: tokens, summed or random (:func:`placed_rewards`)
    :return: dicts with exactly the keys in ``ANNOTATION_FIELDS``, in input order
    :raises DataError: if a row lacks a rollout field
    """
    chosen = critiqued_indices(rows, threshold=threshold)
    requests = round_requests(rows, template=template, threshold=threshold, fields=fields)
    requests, bodies = shape_requests(requests, [rows[i]["response"] for i in chosen], labels=template.labels,
                                      answer_format=answer_format)
    annotations = [skipped_row(row) for row in rows]
    if samples > 1:
        samples_of = sampled_results(client, requests, bodies, cache, samples=samples, progress=progress)
        for i, results in zip(chosen, samples_of):
            annotations[i] = _voted_row(rows[i], results, template=template, tokenizer=tokenizer, rewards=rewards,
                                        alignment=alignment, requested_model=client.model, zero_mean=zero_mean,
                                        fields=fields, answer_format=answer_format,
                                        vote_min=vote_min or majority(samples), placement=placement)
        return annotations
    shaped = {"bodies": bodies} if any(bodies) else {}  # text: today's call (a stand-in client may lack bodies)
    results = client.run(requests, cache, progress=progress, **shaped) if requests else []
    for i, result in zip(chosen, results):
        annotations[i] = _critiqued_row(rows[i], result, template=template, tokenizer=tokenizer,
                                        rewards=rewards, alignment=alignment, requested_model=client.model,
                                        zero_mean=zero_mean, fields=fields, answer_format=answer_format,
                                        placement=placement)
    return annotations
