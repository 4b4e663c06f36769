"""`critique` stage: send low-reward responses to the critic, turn its spans into per-token intrinsic rewards.

With `critic.endpoint: local` the stage starts drlc's own OpenAI-compatible server on
127.0.0.1 (a free port) for the duration of the stage, so the production client path runs
offline. Every request goes through the content-hashed cache first.

A round fails (CriticError, so the stage exits non-zero and writes no annotations) when the
budget stops a request, or when more than ``critic.max_error_rate`` of the critiqued
responses end in api_error, parse_error or truncated. The client has already cached every
good answer by then, so a re-run sends only the requests that failed.
"""
from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass

from pipeline.core.cache import CriticCache
from pipeline.core.config import CriticParams
from pipeline.core.device import resolve_device
from pipeline.core.errors import CriticError
from pipeline.core.round_metrics import intrinsic_reward_sum
from pipeline.critic.align import load_decoding_tokenizer
from pipeline.critic.annotate import STATUSES, annotate_round, skipped_row
from pipeline.critic.client import CriticClient, RunStats
from pipeline.critic.offline.server import serve_in_background
from pipeline.critic.templates import load_template
from pipeline.tasks import get_task

FAILED_STATUSES = ("api_error", "truncated", "parse_error")  # counted against critic.max_error_rate


def scored_rows(rollout_rows: list[dict], score_rows: list[dict]) -> list[dict]:
    """The round's rollouts, each with its env_reward from the scores table (the critic's input)."""
    rewards = {row["rollout_id"]: row["env_reward"] for row in score_rows}
    return [dict(row, env_reward=rewards[row["rollout_id"]]) for row in rollout_rows]


def critic_model_dir(critic: CriticParams, base_dir: str | None) -> str | None:
    """The hf backend's checkpoint: critic.model_dir, where "base" is this run's base model folder.

    With a LoRA policy the base model is the policy with its adapters disabled: self-critique.
    """
    if critic.model_dir == "base":
        if base_dir is None:
            raise CriticError("critic.model_dir 'base' needs the run's base model folder (the critique stage's "
                              "--tokenizer models/base).")
        return base_dir
    return critic.model_dir


@contextlib.contextmanager
def critic_endpoint(critic: CriticParams, base_dir: str | None = None, device=None, labels=None):
    """Yield (base_url, server_stats) — a local server if endpoint is 'local', else the remote URL.

    base_dir: the run's base model folder, served when critic.model_dir is "base". device: where
    the local hf backend's model runs (server_stats()["device"] reads it back from its parameters).
    labels: the template's labels, which a tagger backend's model must tag.
    """
    if critic.endpoint == "local" and critic.backend == "rules":  # in process (RuleClient): no server
        yield None, (lambda: {})
    elif critic.endpoint == "local":
        tagger = critic.backend in ("tagger", "random_spans", "rules")  # the backends that write the template's labels
        model_dir = critic_model_dir(critic, base_dir) if tagger or critic.backend == "hf" else None
        options = {"device": device} if critic.backend == "hf" else {}
        options |= {"labels": tuple(labels) if labels else None} if tagger else {}
        with serve_in_background(backend=critic.backend, model_dir=model_dir, **options) as (base_url, stats):
            yield base_url, stats
    else:
        yield critic.endpoint, (lambda: {})


def critic_device(critic: CriticParams, setting: str):
    """Where the critic's model runs in this process: `setting` (run.device) resolved for a local hf critic;
    None for every other critic (a remote endpoint, the lexicon, a tagger), whose stage then never imports torch."""
    if critic.enabled and critic.endpoint == "local" and critic.backend == "hf":
        return resolve_device(setting)
    return None


def critic_model_id(critic: CriticParams) -> str:
    """The critic's identity in cache keys: critic.model, or for drlc's local server its backend.

    The local server answers with its backend (and checkpoint) whatever model name is sent, so
    its answers are keyed by ``drlc-local:<backend>`` (``drlc-local:hf:<model_dir>``, ``drlc-local:tagger:<model
    hash>``, ``drlc-local:random_spans:<model hash>:seed=<critic.extra_body.drlc_seed>``):
    answers of two backends never mix, a retrained tagger (other model bytes) never reads the old one's
    answers, and a server restarted on another port still hits.
    """
    if critic.endpoint != "local":
        return critic.model
    if critic.backend in ("tagger", "random_spans"):
        from pipeline.critic.offline.tagger import tagger_hash

        seed = f":seed={critic.extra_body.get('drlc_seed', 0)}" if critic.backend == "random_spans" else ""
        return f"drlc-local:{critic.backend}:{tagger_hash(critic.model_dir)}{seed}"
    if critic.backend == "hf" and critic.model_dir:
        return f"drlc-local:hf:{critic.model_dir}"
    if critic.backend == "rules":  # the file and the tasks/ helpers it imports: a helper edit misses the cache
        from pipeline.core.code_deps import code_sha

        return f"drlc-local:rules:{code_sha(critic.model_dir)}"
    return f"drlc-local:{critic.backend}"


# Never contacted: a cache-only client has max_requests=0. Loopback, so no API key is needed.
_CACHE_ONLY_URL = "http://127.0.0.1:9/v1"


def critic_client(critic: CriticParams, base_url: str | None, *, template_sha: str) -> CriticClient:
    """The CriticClient for `critic` sending to base_url; its cache keys hold template_sha.

    base_url None gives a cache-only client: it answers from the cache and never sends
    (max_requests=0, so a cache miss comes back with status "budget"), and needs no API key.
    Raises CriticError for a malformed URL or a remote URL without OPENAI_API_KEY.
    """
    return CriticClient(
        base_url=base_url or _CACHE_ONLY_URL, model=critic.model, model_id=critic_model_id(critic),
        template_sha=template_sha, cache_namespace=critic.cache_namespace,
        prices={model: tuple(price) for model, price in critic.prices.items()},
        max_concurrency=critic.max_concurrency, timeout_s=critic.timeout_s, max_retries=critic.max_retries,
        max_requests=critic.max_requests if base_url else 0, max_cost_usd=critic.max_cost_usd,
        sampling={"temperature": critic.temperature, "max_tokens": critic.max_tokens},
        extra_body=dict(critic.extra_body), connect_wait_s=critic.connect_wait_s,
        server="drlc" if critic.endpoint == "local" else critic.server,  # local: drlc's own server, never asked
    )


def critique(rollout_rows: list[dict], score_rows: list[dict], *, critic: CriticParams, tokenizer_dir: str,
             run_id: str, round_: int, task: str, device=None,
             prompt_rows: list[dict] | None = None) -> tuple[list[dict], dict]:
    """Annotate one round. Returns (annotation rows, metrics of :func:`summarize` plus ``device``).

    Opens a :func:`critic_session` (cache, endpoint: a local server for endpoint 'local') for
    this one round. task: run.task, whose critic_fields fill the template. device: where a local hf critic runs; the metrics' ``device``
    is where its parameters were (None for a critic without a local model, or a disabled critic).
    prompt_rows: the prompts table, whose columns a rule critic (critic.backend rules) may read.

    Raises CriticError, after every good answer is cached and before anything is returned,
    when the budget stopped a request or the round's failures exceed critic.max_error_rate.
    """
    with critic_session(critic, tokenizer_dir=tokenizer_dir, task=task, device=device) as session:
        return session.critique(rollout_rows, score_rows, run_id=run_id, round_=round_, prompt_rows=prompt_rows)


@dataclass
class CriticSession:
    """The critic opened once for any number of rounds: template, tokenizer, cache and endpoint URL.

    None of them when critic.enabled is false (every row is then skipped).
    """

    critic: CriticParams
    template: object = None
    fields: object = None  # the task's critic_fields: row -> the template's placeholder values
    tokenizer: object = None
    cache: CriticCache | None = None
    base_url: str | None = None
    server_stats: object = dict  # () -> the local server's /stats (its model's "device"); {} otherwise

    def critique(self, rollout_rows: list[dict], score_rows: list[dict], *, run_id: str, round_: int,
                 prompt_rows: list[dict] | None = None) -> tuple[list[dict], dict]:
        """One round's (annotation rows, metrics): a fresh client (its budget and counts are per round),
        then :func:`critique_round`. prompt_rows: as in :func:`critique`. Raises CriticError as :func:`critique`."""
        rows = scored_rows(rollout_rows, score_rows)
        if not self.critic.enabled:
            annotations, stats = [skipped_row(row) for row in rows], RunStats()
        elif self.critic.endpoint == "local" and self.critic.backend == "rules":
            annotations, stats = critique_by_rules(rows, prompt_rows or [], critic=self.critic, cache=self.cache,
                                                   template=self.template, fields=self.fields, tokenizer=self.tokenizer)
        else:
            client = critic_client(self.critic, self.base_url, template_sha=self.template.sha256)
            annotations, stats = critique_round(rows, client=client, cache=self.cache, template=self.template,
                                                fields=self.fields, tokenizer=self.tokenizer, critic=self.critic)
        annotations = [dict(a, run_id=run_id, round=round_) for a in annotations]
        return annotations, {**summarize(annotations, stats), "device": self.server_stats().get("device")}


@contextlib.contextmanager
def critic_session(critic: CriticParams, *, tokenizer_dir: str, task: str, device=None):
    """Yield a :class:`CriticSession`; for endpoint 'local' the server runs until the block ends.

    tokenizer_dir: the base model folder (its tokenizer aligns spans; the hf backend's "base").
    device: where a local hf critic's model runs.
    """
    if not critic.enabled:
        yield CriticSession(critic)
        return
    fields = get_task(task).critic_fields
    template = load_template(critic.template, task=task, labels=critic.labels, fields=fields)
    tokenizer = load_decoding_tokenizer(tokenizer_dir)
    with CriticCache(critic.cache_dir) as cache, \
            critic_endpoint(critic, tokenizer_dir, device, template.labels) as (base_url, stats):
        yield CriticSession(critic, template, fields, tokenizer, cache, base_url, stats)


def critique_by_rules(rows: list[dict], prompt_rows: list[dict], *, critic: CriticParams, cache: CriticCache, template,
                      fields, tokenizer, progress: bool = True) -> tuple[list[dict], RunStats]:
    """critic.backend rules: :func:`critique_round` with the file's critic() called in this process (RuleClient) on
    each critiqued row and its prompt's columns (from `prompt_rows`, the prompts table). Its answers are JSON spans
    (any character), cached as the HTTP client would. It sends nothing, so replay runs it too."""
    import dataclasses
    import json

    from pipeline.critic.annotate import critiqued_indices
    from pipeline.critic.offline.rules import RuleClient

    critic = dataclasses.replace(critic, answer_format="json")
    keys = critic_client(critic, None, template_sha=template.sha256).key_for
    columns = {row["prompt_id"]: json.loads(row.get("columns") or "{}") for row in prompt_rows}
    chosen = [{**columns.get(rows[i]["prompt_id"], {}), **rows[i]}  # a rollout field wins over a column
              for i in critiqued_indices(rows, threshold=critic.threshold)]
    client = RuleClient(critic.model_dir, labels=template.labels, rows=chosen, keys=keys)
    return critique_round(rows, client=client, cache=cache, template=template, fields=fields, tokenizer=tokenizer,
                          critic=critic, progress=progress)


def critique_round(rows: list[dict], *, client, cache: CriticCache, template, fields, tokenizer,
                   critic: CriticParams, progress: bool = True, budget_error=None) -> tuple[list[dict], RunStats]:
    """Annotate scored rows with an open client and cache; then the budget and health checks.

    The one critique of a round that the stage, replay and the study all run. rows: rollouts with
    env_reward (:func:`scored_rows`); client: a CriticClient (or an object with its ``run``,
    ``model`` and ``last_stats``); fields: the task's critic_fields. budget_error: as in :func:`check_budget`, for a caller that explains
    budget-stopped rows its own way (replay with a cache-only client: the answers are not cached).
    Returns (annotations, the client's RunStats for this round).
    Raises CriticError as :func:`check_budget` and :func:`check_health`.
    """
    annotations = annotate_round(
        rows, template=template, fields=fields, tokenizer=tokenizer, client=client, cache=cache,
        threshold=critic.threshold, rewards=dict(critic.rewards), alignment=critic.alignment,
        zero_mean=critic.zero_mean, progress=progress, answer_format=critic.answer_format,
        samples=critic.samples, vote_min=critic.vote_min, placement=critic.placement,
    )
    check_budget(annotations, critic, error=budget_error)
    check_health(annotations, max_error_rate=critic.max_error_rate)
    return annotations, client.last_stats


def check_budget(annotations: list[dict], critic: CriticParams, *, error=None) -> None:
    """Raise CriticError if the budget left critiqued responses without an answer.

    error(stopped count) -> the exception to raise instead (None: the CriticError below).
    """
    stopped = sum(a["status"] == "budget" for a in annotations)
    if stopped and error is not None:
        raise error(stopped)
    if stopped:
        raise CriticError(
            f"critic budget reached (critic.max_requests={critic.max_requests}, critic.max_cost_usd="
            f"{critic.max_cost_usd}): {stopped} responses were not critiqued. Every answer received is "
            f"cached; raise the budget and re-run (cached answers cost nothing)."
        )


def _error_kind(annotation: dict) -> str:
    """What a failed row is grouped under: the api_error's reason (http_500, timeout, ...) or its status."""
    if annotation["status"] == "api_error" and annotation["error"]:
        return annotation["error"].split(":", 1)[0]
    return annotation["status"]


_HINTS = {
    "api_error": "every good answer is cached, re-run to retry only the failures",
    "truncated": "raise critic.max_tokens (a truncated answer is cached under its max_tokens)",
    "parse_error": "parse errors come from cached answers: check critic.template and critic.model",
}


def check_health(annotations: list[dict], *, max_error_rate: float) -> None:
    """Raise CriticError (one line) if more than max_error_rate of the critiqued rows failed.

    Failed = status api_error, parse_error or truncated. The line names the count, the share,
    the limit, the most common error with its count, and what to do.
    """
    critiqued = [a for a in annotations if a["critiqued"]]
    failed = [a for a in critiqued if a["status"] in FAILED_STATUSES]
    if not critiqued or len(failed) / len(critiqued) <= max_error_rate:
        return
    kinds = Counter(_error_kind(a) for a in failed)
    kind, count = kinds.most_common(1)[0]
    example = next(a for a in failed if _error_kind(a) == kind)
    shown = " ".join((example["error"] or example["status"]).split())
    shown = shown if len(shown) <= 100 else f"{shown[:97]}..."
    hints = [_HINTS[s] for s in FAILED_STATUSES if any(a["status"] == s for a in failed)]
    hints = "; ".join(h for h in hints if h.split(" (")[0] not in shown)  # a fix the error names already is not repeated
    raise CriticError(
        f"critique: {len(failed)} of {len(critiqued)} critiqued responses failed "
        f"({len(failed) / len(critiqued):.0%} > critic.max_error_rate {max_error_rate:.0%}); "
        f"most common, {count} of them: {shown}" + (f"; {hints}" if hints else "")
    )


def summarize(annotations: list[dict], stats: RunStats) -> dict:
    """Per-round critic metrics: row counts from the annotations, HTTP counts from the client.

    critiqued, status_<status> for every status (STATUSES, plus any other that occurs),
    critic_error_rate (failed / critiqued rows), intrinsic_reward_sum (mean over responses of
    the summed intrinsic rewards); critic_requests (HTTP attempts, retries included),
    critic_retries, critic_failures (requests ended in api_error), cache_hits (requests
    answered from the cache) and critic_cost_usd (dollars paid, failed attempts included)
    from ``stats``, the client's :class:`~pipeline.critic.client.RunStats`.
    """
    critiqued = sum(a["critiqued"] for a in annotations)
    by_status = dict.fromkeys(STATUSES, 0) | Counter(a["status"] for a in annotations)
    failed = sum(by_status[s] for s in FAILED_STATUSES)
    return {
        "critiqued": critiqued,
        "critic_requests": stats.requests_sent,
        "critic_retries": stats.retries,
        "critic_failures": stats.failures,
        "cache_hits": stats.cache_hits,
        "critic_cost_usd": stats.cost_usd,
        "critic_error_rate": failed / critiqued if critiqued else 0.0,
        "intrinsic_reward_sum": intrinsic_reward_sum([a["token_rewards"] for a in annotations]),
        **{f"status_{s}": n for s, n in by_status.items()},
    }
