"""`drlc critic eval`: audit a critic's spans against human-labelled spans.

The critic configured in a params file (any backend or endpoint) answers every post of a
labelled span file through the run's own path: the template (``critic.template``), the
content-hashed cache (``critic.cache_dir``), the client and its budgets
(:func:`pipeline.steps.critique.critic_client`), the parser and the aligner's span search.
So a re-run, or an audit of posts a training run already critiqued with the same
settings, sends no request. Each answer becomes predicted spans and is scored by
:mod:`pipeline.audit.span_metrics`.

Reference points are scored on the same posts: the offline lexicon critic (through the
local server, like the demo) and the baselines of :mod:`pipeline.audit.span_baselines`
(``wordlist`` only with a train split). A post the critic could not answer (``api_error``)
or whose answer could not be read (``parse_error``) predicts no span and is scored like
that; the status shares show how many there were. A budget stop raises after every
answer received is cached, as in the critique stage.

Results: one row per (critic, post) in the ``critic_eval`` table
(``<data>/critic_eval/audit=<name>/part-0.parquet``, a view in ``drlc sql``), and
``summary.json`` plus ``report.md`` in the output folder.
"""
from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from pipeline.audit.labelled import LabelledPost, read_labelled
from pipeline.audit.report import render_report
from pipeline.audit.span_baselines import everything, learn_wordlist, nothing, wordlist_spans
from pipeline.audit.span_metrics import SPAN_IOU, PostScore, score_post, span_precision_recall
from pipeline.core import store
from pipeline.core.cache import CriticCache
from pipeline.core.config import CriticParams
from pipeline.core.errors import ConfigError
from pipeline.critic.align import find_occurrences
from pipeline.critic.annotate import read_answer as annotate_read_answer
from pipeline.critic.annotate import sampled_results
from pipeline.critic.structured import shape_requests
from pipeline.critic.templates import Template, load_template
from pipeline.critic.vote import majority, vote_spans
from pipeline.steps.critique import check_budget, critic_client, critic_endpoint
from pipeline.steps.stage import write_json
from pipeline.tasks import get_task

__all__ = ["STATUSES", "Reading", "read_answer", "sample_posts", "audit_critic", "write_audit"]

STATUSES = ("ok", "none", "no_match", "parse_error", "api_error", "truncated")
# the reference critic: the offline lexicon critic through the local server (free, so no budget)
LEXICON = {"endpoint": "local", "backend": "lexicon", "model": "drlc-lexicon", "model_dir": None,
           "max_requests": None, "max_cost_usd": None, "samples": 1, "vote_min": None}


@dataclass(frozen=True)
class Reading:
    """A critic answer read against the post it is about.

    Attributes:
        status: ``ok`` (at least one span proposed), ``none`` (explicitly nothing) or ``parse_error``.
        spans: the located spans ``(label, start, end)``: every occurrence of every proposed span.
        proposed: how many distinct spans the answer proposed.
        absent: how many of them occur nowhere in the post.
        error: why the answer could not be read, or ``""``.
    """

    status: str
    spans: tuple[tuple[str, int, int], ...] = ()
    proposed: int = 0
    absent: int = 0
    error: str = ""


def read_answer(raw_text: str, text: str, *, template: Template, answer_format: str = "text") -> Reading:
    """Parse a critic answer and locate its spans in ``text`` (the one adapter to the parser/aligner API).

    The round's own reading (:func:`pipeline.critic.annotate.read_answer`) decides which items
    are kept; kept spans are located as the aligner locates them for token rewards (every
    occurrence, its tolerant matching), so the audit scores exactly the characters training
    would reward. Every template label counts here (the audit scores spans, not rewards).
    """
    read = annotate_read_answer(raw_text, labels=template.labels, leading_label=template.leading_label,
                                response=text, rewards={label: 1.0 for label in template.labels},
                                answer_format=answer_format)
    absent = sum(item["reason"].startswith("not in the response") for item in read.dropped)
    located = [(label, start, end) for label, span in read.kept for start, end in find_occurrences(text, span)]
    return Reading(status=read.status, spans=tuple(located), proposed=len(read.items), absent=absent,
                   error=read.error)


def sample_posts(posts: list[LabelledPost], *, limit: int | None, seed: int) -> list[LabelledPost]:
    """A seeded sample of ``limit`` posts in file order (all posts when limit is None or >= their number)."""
    if limit is None or limit >= len(posts):
        return list(posts)
    if limit < 1:
        raise ConfigError(f"--limit {limit}: give a positive number of posts, or leave it out for all")
    chosen = sorted(random.Random(seed).sample(range(len(posts)), limit))
    return [posts[i] for i in chosen]


def _critic_rows(posts, *, critic: CriticParams, template: Template, fields, cache: CriticCache,
                 base_dir: str | None, progress: bool) -> tuple[list[dict], dict]:
    """Ask `critic` about every post; return one prediction row per post and the call counters."""
    requests, bodies = shape_requests([template.render(fields(post.request_row())) for post in posts],
                                      [post.text for post in posts], labels=template.labels,
                                      answer_format=critic.answer_format)
    with critic_endpoint(critic, base_dir, labels=template.labels) as (base_url, server_stats):
        client = critic_client(critic, base_url, template_sha=template.sha256)
        if critic.samples > 1:
            samples = sampled_results(client, requests, bodies, cache, samples=critic.samples, progress=progress)
        else:
            samples = [[result] for result in client.run(requests, cache, progress=progress, bodies=bodies)]
        stats, server_requests = client.last_stats, server_stats().get("requests", 0)
    check_budget([{"status": r.status} for results in samples for r in results], critic)  # the stage's own check
    rows = []
    for post, results in zip(posts, samples):
        reading = _voted_reading(post.text, results, template=template, critic=critic)
        result = _summed(results)
        rows.append({
            "critic_model": result.model or critic.model, "status": reading.status,
            "pred_spans": reading.spans, "proposed_spans": reading.proposed, "absent_spans": reading.absent,
            "cache_hit": result.cache_hit, "cost_usd": result.cost_usd, "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens, "raw_text": result.raw_text,
            "error": reading.error,
            "full_cost_usd": client.cost_of(result.model or critic.model, result.prompt_tokens,
                                            result.completion_tokens),
        })
    calls = {"requests_sent": stats.requests_sent, "retries": stats.retries, "cache_hits": stats.cache_hits,
             "server_requests": server_requests, "cost_usd": stats.cost_usd}
    return rows, calls


def _voted_reading(text: str, results, *, template: Template, critic: CriticParams) -> Reading:
    """One answer's :class:`Reading`, or for critic.samples > 1 the characters that critic.vote_min answers mark."""
    readings = [read_answer(r.raw_text, text, template=template, answer_format=critic.answer_format)
                if r.status == "ok" else Reading(status=r.status, error=r.error) for r in results]
    if len(readings) == 1:
        return readings[0]
    voted = tuple(vote_spans([list(r.spans) for r in readings], vote_min=critic.vote_min or majority(len(readings))))
    statuses = [r.status for r in readings]
    proposed, absent = sum(r.proposed for r in readings), sum(r.absent for r in readings)
    if voted:
        return Reading(status="ok", spans=voted, proposed=proposed, absent=absent)
    status = "none" if "ok" in statuses else max(STATUSES, key=statuses.count)
    return Reading(status=status, proposed=proposed, absent=absent,
                   error=next((r.error for r in readings if r.error), ""))


def _summed(results):
    """The first result with the token counts and costs of all samples added up."""
    first = results[0]
    return dataclasses.replace(first, prompt_tokens=sum(r.prompt_tokens for r in results),
                               completion_tokens=sum(r.completion_tokens for r in results),
                               cost_usd=sum(r.cost_usd for r in results),
                               cache_hit=all(r.cache_hit for r in results),
                               raw_text=first.raw_text if len(results) == 1 else json.dumps(
                                   [r.raw_text for r in results], ensure_ascii=False))


def _baseline_rows(posts, predict, model: str) -> list[dict]:
    rows = []
    for post in posts:
        spans = tuple(predict(post))
        rows.append({"critic_model": model, "status": "ok" if spans else "none", "pred_spans": spans,
                     "proposed_spans": len(spans), "absent_spans": 0, "cache_hit": False, "cost_usd": 0.0,
                     "prompt_tokens": 0, "completion_tokens": 0, "raw_text": "", "error": "",
                     "full_cost_usd": 0.0})
    return rows


def _scored(posts, predictions: list[dict], *, audit: str, critic: str, iou: float) -> list[dict]:
    """The critic_eval table rows of one critic: post, gold, prediction and its scores."""
    rows = []
    for post, pred in zip(posts, predictions):
        score = score_post(pred["pred_spans"], post.spans, iou=iou)
        row = {key: value for key, value in pred.items() if key != "full_cost_usd"}
        row.update(
            audit=audit, critic=critic, line=post.line, post_id=post.post_id, text=post.text,
            gold_spans=[_span_dict(s) for s in post.spans], pred_spans=[_span_dict(s) for s in pred["pred_spans"]],
            char_f1=score.char_f1, n_gold_spans=score.n_gold_spans, n_pred_spans=score.n_pred_spans,
            matched_pred=score.matched_pred, matched_gold=score.matched_gold,
        )
        rows.append(row)
    return rows


def _span_dict(span: tuple[str, int, int]) -> dict:
    return {"label": span[0], "start": span[1], "end": span[2]}


def _summary(rows: list[dict], predictions: list[dict], calls: dict | None) -> dict:
    """One critic's scores, status shares, absent-span share, calls and cost."""
    n = len(rows)
    scores = [PostScore(r["char_f1"], r["n_pred_spans"], r["n_gold_spans"], r["matched_pred"], r["matched_gold"])
              for r in rows]
    proposed = sum(r["proposed_spans"] for r in rows)
    counts = Counter(r["status"] for r in rows)
    statuses = {s: counts[s] / n for s in sorted(set(STATUSES) | set(counts))}
    calls = calls or {"requests_sent": 0, "retries": 0, "cache_hits": 0, "server_requests": 0, "cost_usd": 0.0}
    return {
        "critic_model": rows[0]["critic_model"], "n_posts": n,
        "char_f1": sum(s.char_f1 for s in scores) / n, **span_precision_recall(scores),
        "status_share": statuses,
        "absent_span_share": sum(r["absent_spans"] for r in rows) / proposed if proposed else None,
        "proposed_spans": proposed, **calls,
        "cost_usd_uncached": sum(p["full_cost_usd"] for p in predictions),
    }


def audit_critic(*, spans_path: str | Path, critic: CriticParams, task: str | None = None,
                 train_path: str | Path | None = None,
                 limit: int | None = None, seed: int = 0, iou: float = SPAN_IOU, references: bool = True,
                 base_dir: str | None = None, audit: str = "audit", progress: bool = True) -> tuple[list[dict], dict]:
    """Score `critic` (and the reference points) on a labelled span file.

    :param spans_path: the labelled posts (:func:`~pipeline.audit.labelled.read_labelled`)
    :param critic: the params file's critic section, used unchanged
    :param task: the run's task (``run.task``), needed for a plain-text ``critic.template``
    :param train_path: labelled train split for the word-list baseline (None: no word list)
    :param limit: score a seeded sample of this many posts (None: all)
    :param seed: the sample's seed
    :param iou: the span match threshold of :func:`~pipeline.audit.span_metrics.score_post`
    :param references: also score the lexicon critic and the baselines
    :param base_dir: the run's base model folder, for ``critic.model_dir: base``
    :param audit: the audit's name, put in every row
    :return: (critic_eval rows, summary dict)
    :raises DataError: a malformed span file; ConfigError, CriticError: as the critique stage
    """
    if not 0 < iou <= 1:
        raise ConfigError(f"--span-iou {iou}: the span match threshold must be in (0, 1]")
    fields = get_task(task).critic_fields if task else None  # None: a Markdown template names its task
    template = load_template(critic.template, task=task, labels=critic.labels, fields=fields)
    fields = fields or get_task(template.task).critic_fields
    posts = sample_posts(read_labelled(spans_path, labels=template.labels), limit=limit, seed=seed)
    runs: dict[str, tuple[list[dict], dict | None]] = {}
    with CriticCache(critic.cache_dir) as cache:
        runs["configured"] = _critic_rows(posts, critic=critic, template=template, fields=fields, cache=cache,
                                          base_dir=base_dir, progress=progress)
        lexicon = dataclasses.replace(critic, **LEXICON)
        lexicon_is_configured = lexicon == critic
        if references and not lexicon_is_configured:
            runs["lexicon"] = _critic_rows(posts, critic=lexicon, template=template, fields=fields, cache=cache,
                                           base_dir=None, progress=progress)
    if references:
        labels = template.labels
        runs["everything"] = _baseline_rows(posts, lambda p: everything(p, labels), "baseline"), None
        runs["nothing"] = _baseline_rows(posts, lambda p: nothing(p, labels), "baseline"), None
        if train_path is not None:
            words = learn_wordlist(read_labelled(train_path, labels=labels))
            runs["wordlist"] = _baseline_rows(posts, lambda p: wordlist_spans(p, words), "baseline"), None
    table, critics = [], {}
    for name, (predictions, calls) in runs.items():
        rows = _scored(posts, predictions, audit=audit, critic=name, iou=iou)
        table += rows
        critics[name] = _summary(rows, predictions, calls)
    summary = {
        "audit": audit, "spans_file": str(spans_path), "train_file": str(train_path) if train_path else None,
        "wordlist_in_sample": bool(train_path) and Path(train_path).resolve() == Path(spans_path).resolve(),
        "n_posts": len(posts), "n_posts_with_gold": sum(bool(p.spans) for p in posts), "limit": limit,
        "seed": seed, "template": critic.template, "template_sha": template.sha256,
        "critic_endpoint": critic.endpoint if critic.endpoint != "local" else f"local:{critic.backend}",
        "span_match": f"same label and character IoU >= {iou}", "lexicon_is_configured": lexicon_is_configured,
        "critics": critics,
    }
    return table, summary


def write_audit(rows: list[dict], summary: dict, *, data_dir: str | Path, out_dir: str | Path) -> dict:
    """Write the critic_eval partition, summary.json and report.md; return their paths."""
    table = store.write_table(rows, "critic_eval", store.audit_dir(data_dir, summary["audit"]))
    out_dir = Path(out_dir)
    write_json(summary, out_dir / "summary.json")
    report = out_dir / "report.md"
    report.write_text(render_report(summary), encoding="utf-8")
    return {"table": table, "summary": out_dir / "summary.json", "report": report}
