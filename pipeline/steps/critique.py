"""`critique` stage: send low-reward responses to the critic, turn its spans into token rewards.

With `critic.endpoint: local` the stage starts drlc's own OpenAI-compatible server on
127.0.0.1 (a free port) for the duration of the stage, so the production client path runs
offline. Every request goes through the content-hashed cache first.
"""
from __future__ import annotations

import contextlib

from transformers import AutoTokenizer

from pipeline.config import CriticParams
from pipeline.errors import CriticError
from pipeline.critic.annotate import STATUSES, annotate_round, skipped_row
from pipeline.critic.cache import CriticCache
from pipeline.critic.client import CriticClient
from pipeline.critic.server import serve_in_background
from pipeline.critic.templates import load_template


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
def critic_endpoint(critic: CriticParams, base_dir: str | None = None):
    """Yield (base_url, server_stats) — a local server if endpoint is 'local', else the remote URL.

    base_dir: the run's base model folder, served when critic.model_dir is "base".
    """
    if critic.endpoint == "local":
        model_dir = critic_model_dir(critic, base_dir) if critic.backend == "hf" else None
        with serve_in_background(backend=critic.backend, model_dir=model_dir) as (base_url, stats):
            yield base_url, stats
    else:
        yield critic.endpoint, (lambda: {})


def cache_endpoint(critic: CriticParams) -> str:
    """The endpoint as named in cache keys: stable for the local server, whose port changes per run."""
    if critic.endpoint != "local":
        return critic.endpoint
    if critic.backend == "hf" and critic.model_dir:
        return f"drlc-local:hf:{critic.model_dir}"
    return f"drlc-local:{critic.backend}"


# Never contacted: a cache-only client has max_requests=0. Loopback, so no API key is needed.
_CACHE_ONLY_URL = "http://127.0.0.1:9/v1"


def critic_client(critic: CriticParams, base_url: str | None) -> CriticClient:
    """The CriticClient for `critic` sending to base_url, with cache keys named by cache_endpoint().

    base_url None gives a cache-only client: it answers from the cache and never sends
    (max_requests=0, so a cache miss comes back with status "budget"), and needs no API key.
    Raises CriticError for a malformed URL or a remote URL without OPENAI_API_KEY.
    """
    return CriticClient(
        base_url=base_url or _CACHE_ONLY_URL, model=critic.model, cache_endpoint=cache_endpoint(critic),
        prices={model: tuple(price) for model, price in critic.prices.items()},
        max_concurrency=critic.max_concurrency, timeout_s=critic.timeout_s, max_retries=critic.max_retries,
        max_requests=critic.max_requests if base_url else 0, max_cost_usd=critic.max_cost_usd,
        sampling={"temperature": critic.temperature, "max_tokens": critic.max_tokens},
    )


def critique(rollout_rows: list[dict], score_rows: list[dict], *, critic: CriticParams, tokenizer_dir: str,
             run_id: str, round_: int, task: str | None = None) -> tuple[list[dict], dict]:
    """Annotate one round. Returns (annotation rows, stats with the requests the server received).

    task: run.task, needed to load a plain-text critic.template (pipeline.critic.templates)."""
    rows = scored_rows(rollout_rows, score_rows)
    if not critic.enabled:
        annotations = [skipped_row(row) for row in rows]
        server_requests = 0
    else:
        template = load_template(critic.template, task=task, labels=critic.labels)
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        with CriticCache(critic.cache_dir) as cache, critic_endpoint(critic, tokenizer_dir) as (base_url, server_stats):
            client = critic_client(critic, base_url)
            annotations = annotate_round(
                rows, template=template, tokenizer=tokenizer, client=client, cache=cache,
                threshold=critic.threshold, rewards=dict(critic.rewards), alignment=critic.alignment,
                zero_mean=critic.zero_mean,
            )
            server_requests = server_stats().get("requests", 0)
        stopped = sum(a["status"] == "budget" for a in annotations)
        if stopped:
            raise CriticError(
                f"critic budget reached (critic.max_requests={critic.max_requests}, critic.max_cost_usd="
                f"{critic.max_cost_usd}): {stopped} responses were not critiqued. Every answer received is "
                f"cached; raise the budget and re-run (cached answers cost nothing)."
            )
    annotations = [dict(a, run_id=run_id, round=round_) for a in annotations]
    return annotations, summarize(annotations, server_requests)


def summarize(annotations: list[dict], server_requests: int) -> dict:
    """Per-round critic metrics (names `critic/<quantity>`)."""
    critiqued = [a for a in annotations if a["critiqued"]]
    by_status = {s: sum(a["status"] == s for a in annotations) for s in
                 STATUSES}
    return {
        "critic/critiqued": len(critiqued),
        "critic/cache_hits": sum(a["cache_hit"] for a in critiqued),
        "critic/server_requests": server_requests,
        "critic/cost_usd": sum(a["cost_usd"] for a in annotations),
        "critic/intrinsic_reward_sum": sum(sum(a["token_rewards"]) for a in annotations) / max(len(annotations), 1),
        **{f"critic/status_{s}": n for s, n in by_status.items()},
    }
