"""The lexicon critic called in-process, behind drlc's content-hashed cache, with cost accounting.

It duck-types :meth:`pipeline.critic.client.CriticClient.run`, so
:func:`pipeline.critic.annotate.annotate_round` (threshold, rendering, parsing, alignment) runs
unchanged; only the HTTP hop to the local server is skipped for speed. Cache keys use the same
recipe and model identity as the pipeline's local lexicon server ("drlc-local:lexicon"), so entries
are interchangeable when ``template_sha`` is the template's SHA-256. Token counts are estimates (characters / 4 of the messages and of the
answer): the lexicon backend has no tokenizer, and the estimate is what a gpt-3.5-turbo critic
reading the same prompt would roughly be billed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from pipeline.critic import lexicon
from pipeline.critic.cache import MISSING, CriticCache, cache_key
from pipeline.critic.client import CriticResult, RunStats
from pipeline.errors import CriticError

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


class InProcessLexiconCritic:
    """A cache-first critic that answers misses with the lexicon backend (or refuses them).

    Params: prices: (prompt, completion) USD per 1M tokens used for the cost accounting;
    allow_calls: False makes every cache miss an error (the zero-cost replay mode);
    template_sha: SHA-256 of the template that renders the requests (part of every cache key).
    """

    model = MODEL

    def __init__(self, *, prices: tuple[float, float] = GPT35_PRICES, allow_calls: bool = True,
                 template_sha: str = ""):
        self.prices, self.allow_calls, self.template_sha = prices, allow_calls, template_sha
        self.tally = CriticTally()
        self.last_stats = RunStats()  # as CriticClient; critique_round returns it (the study reads the tally)
        self.arm = ""  # the arm the next requests are counted under

    def _cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.prices[0] + completion_tokens * self.prices[1]) / 1e6

    def run(self, requests: list[list[dict]], cache: CriticCache, *, sample_index: int = 0,
            progress: bool = False) -> list[CriticResult]:
        """Answer each request from the cache, else (when allowed) from the lexicon; one result per request.

        Raises: CriticError on a cache miss when allow_calls is False.
        """
        return [self._answer(messages, cache, sample_index) for messages in requests]

    def _answer(self, messages: list[dict], cache: CriticCache, sample_index: int) -> CriticResult:
        key = cache_key(model=MODEL_ID, messages=messages, template_sha=self.template_sha, sample_index=sample_index,
                        **SAMPLING)
        counts = self.tally.by_arm.setdefault(self.arm, {"requests": 0, "calls": 0, "cache_hits": 0})
        self.tally.requests += 1
        counts["requests"] += 1
        value = cache.get(key)
        hit = value is not MISSING
        if not hit:
            if not self.allow_calls:
                raise CriticError(f"replay critic: cache miss for key {key[:12]}...; a replay must not call the "
                                  "critic, so replay only settings whose answers the recorded run cached")
            text = lexicon.answer(messages)
            prompt = sum(estimated_tokens(str(m["content"])) for m in messages)
            value = {"raw_text": text, "finish_reason": "stop", "model": MODEL, "system_fingerprint": None,
                     "latency_s": 0.0, "usage": {"prompt_tokens": prompt, "completion_tokens": estimated_tokens(text)}}
            cache.put(key, value)
        prompt_tokens, completion_tokens = value["usage"]["prompt_tokens"], value["usage"]["completion_tokens"]
        cost = self._cost(prompt_tokens, completion_tokens)
        self.tally.cost_without_cache_usd += cost
        if hit:
            self.tally.cache_hits += 1
            counts["cache_hits"] += 1
        else:
            self.tally.calls += 1
            counts["calls"] += 1
            self.tally.prompt_tokens += prompt_tokens
            self.tally.completion_tokens += completion_tokens
            self.tally.cost_usd += cost
        return CriticResult(status="ok", cache_key=key, cache_hit=hit, raw_text=value["raw_text"],
                            finish_reason="stop", model=MODEL, prompt_tokens=prompt_tokens,
                            completion_tokens=completion_tokens, cost_usd=0.0 if hit else cost)
