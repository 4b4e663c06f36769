"""The study's critic: the pipeline's own client and local lexicon server, plus a would-be cost tally.

Requests go through :class:`pipeline.critic.client.CriticClient` to drlc's lexicon server on
127.0.0.1, cache first, exactly as in a DVC round (same cache keys, so entries are
interchangeable with the pipeline's). What is study-specific is only the accounting:
:class:`TalliedCritic` counts requests, calls (cache misses) and hits per arm, and prices
every answer as a gpt-3.5-turbo critic reading the same prompt would roughly be billed:
characters / 4 of the messages and of the answer (the lexicon backend has no tokenizer).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

from pipeline.core.cache import CriticCache
from pipeline.critic.client import CriticClient, CriticResult
from pipeline.critic.offline.server import serve_in_background

MODEL_ID = "drlc-local:lexicon"  # the model identity the pipeline's local lexicon server is keyed under
MODEL = "drlc-lexicon"
SAMPLING = {"temperature": 0.0, "max_tokens": 256}
GPT35_PRICES = (0.5, 1.5)  # USD per 1M prompt / completion tokens (gpt-3.5-turbo)


def estimated_tokens(text: str) -> int:
    """ceil(characters / 4): the usual rule of thumb for English text under GPT tokenizers."""
    return math.ceil(len(text) / 4)


@dataclass
class CriticTally:
    """Counters over every request a critic answered: requests, calls (cache misses), hits, tokens, dollars."""

    requests: int = 0
    calls: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0  # of the calls made
    completion_tokens: int = 0
    cost_usd: float = 0.0  # what the calls would have cost at the prices
    cost_without_cache_usd: float = 0.0  # what every request would have cost with no cache
    by_arm: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k != "by_arm"}
        return {**out, "cost_usd": round(self.cost_usd, 6), "cost_without_cache_usd": round(self.cost_without_cache_usd, 6),
                "by_arm": {arm: dict(counts) for arm, counts in self.by_arm.items()}}


@contextlib.contextmanager
def lexicon_client(*, template_sha: str, allow_calls: bool = True):
    """Yield a CriticClient to drlc's lexicon server, started on loopback for the ``with`` block.

    allow_calls False gives a cache-only client (max_requests 0): a miss comes back as status
    "budget", which the round's budget check turns into an error (the zero-cost replay mode).
    """
    with serve_in_background(backend="lexicon") as (base_url, _):
        yield CriticClient(base_url=base_url, model=MODEL, model_id=MODEL_ID, template_sha=template_sha,
                           sampling=SAMPLING, max_requests=None if allow_calls else 0)


class TalliedCritic:
    """A :class:`CriticClient` (duck-typed for ``critique_round``) whose answers are also tallied per arm.

    Params: client: the client that answers; prices: (prompt, completion) USD per 1M tokens of
    the would-be cost; allow_calls: whether the client may send (recorded for the ablation's check).
    """

    model = MODEL

    def __init__(self, client: CriticClient, *, prices: tuple[float, float] = GPT35_PRICES, allow_calls: bool = True):
        self.client, self.prices, self.allow_calls = client, prices, allow_calls
        self.tally = CriticTally()
        self.arm = ""  # the arm the next requests are counted under

    @property
    def last_stats(self):
        return self.client.last_stats

    def run(self, requests: list[list[dict]], cache: CriticCache, *, sample_index: int = 0,
            progress: bool = False) -> list[CriticResult]:
        """Answer the requests with the client, then tally each one; one result per request."""
        results = self.client.run(requests, cache, sample_index=sample_index, progress=progress)
        answered: set[str] = set()  # a repeat within the call is answered by the first: a hit
        for messages, result in zip(requests, results):
            if result.status == "ok":
                self._count(messages, result, hit=result.cache_hit or result.cache_key in answered)
                answered.add(result.cache_key)
        return results

    def _count(self, messages: list[dict], result: CriticResult, *, hit: bool) -> None:
        counts = self.tally.by_arm.setdefault(self.arm, {"requests": 0, "calls": 0, "cache_hits": 0})
        prompt_tokens = sum(estimated_tokens(str(m["content"])) for m in messages)
        completion_tokens = estimated_tokens(result.raw_text)
        cost = (prompt_tokens * self.prices[0] + completion_tokens * self.prices[1]) / 1e6
        self.tally.requests += 1
        counts["requests"] += 1
        self.tally.cost_without_cache_usd += cost
        if hit:
            self.tally.cache_hits += 1
            counts["cache_hits"] += 1
            return
        self.tally.calls += 1
        counts["calls"] += 1
        self.tally.prompt_tokens += prompt_tokens
        self.tally.completion_tokens += completion_tokens
        self.tally.cost_usd += cost
