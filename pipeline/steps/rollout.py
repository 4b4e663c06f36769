"""`rollout` stage: sample responses to a batch of train prompts from the current policy.

Response lengths: with ``rollout.min_new_tokens`` set, each response gets its own limit drawn
uniformly from [min_new_tokens, max_new_tokens] (both included) by a seeded generator, as the
paper's runs did with legacy TRL's LengthSampler (sentiment 15-20 new tokens, detoxification
10-14; note LengthSampler(a, b) itself draws from range(a, b), which excludes b). The batch is
sampled once with max_new_tokens and each response is then cut to its limit: tokens are drawn
one at a time, so the first L tokens of a longer sample have exactly the distribution of a
sample stopped after L tokens, and their behaviour log-probs are unchanged by the cut.
"""
from __future__ import annotations

import random
import time

import torch

from pipeline.core.device import module_device
from pipeline.core.seeding import round_seed
from pipeline.model.policy import load_policy
from pipeline.model.sampling import sample_responses
from pipeline.parallel.shard import Shard


def encode_query(tokenizer, text: str) -> list[int]:
    """A query's token ids: BOS (when the tokenizer has one) + the text without other special tokens."""
    bos = [] if tokenizer.bos_token_id is None else [tokenizer.bos_token_id]
    return bos + tokenizer.encode(text, add_special_tokens=False)


def response_limits(n: int, *, min_new_tokens: int | None, max_new_tokens: int, seed: int) -> list[int]:
    """Per-response new-token limits: uniform integers in [min_new_tokens, max_new_tokens], seeded.

    min_new_tokens None gives max_new_tokens for every response (one fixed length limit).
    """
    if min_new_tokens is None:
        return [max_new_tokens] * n
    assert 0 < min_new_tokens <= max_new_tokens, (min_new_tokens, max_new_tokens)
    draw = random.Random(seed)
    return [draw.randint(min_new_tokens, max_new_tokens) for _ in range(n)]


def rollout(prompt_rows: list[dict], *, policy_dir: str, policy_name: str, run_id: str, round_: int,
            seed: int, batch_size: int, max_new_tokens: int, generation_batch_size: int,
            min_new_tokens: int | None = None, device: str | torch.device = "cpu") -> list[dict]:
    """The rows of `rollout_round` (without its metrics)."""
    return rollout_round(prompt_rows, policy_dir=policy_dir, policy_name=policy_name, run_id=run_id, round_=round_,
                         seed=seed, batch_size=batch_size, max_new_tokens=max_new_tokens,
                         generation_batch_size=generation_batch_size, min_new_tokens=min_new_tokens,
                         device=device)[0]


def rollout_round(prompt_rows: list[dict], *, policy_dir: str, policy_name: str, run_id: str, round_: int,
                  seed: int, batch_size: int, max_new_tokens: int, generation_batch_size: int,
                  min_new_tokens: int | None = None, device: str | torch.device = "cpu",
                  shard: Shard | None = None) -> tuple[list[dict], dict]:
    """Load the policy of `policy_dir` onto `device` and run :func:`rollout_with` on it (the rollout stage)."""
    policy, tokenizer = load_policy(policy_dir)
    return rollout_with(policy.to(device), tokenizer, prompt_rows, policy_name=policy_name, run_id=run_id,
                        round_=round_, seed=seed, batch_size=batch_size, max_new_tokens=max_new_tokens,
                        generation_batch_size=generation_batch_size, min_new_tokens=min_new_tokens, shard=shard)


def rollout_with(policy, tokenizer, prompt_rows: list[dict], *, policy_name: str, run_id: str, round_: int,
                 seed: int, batch_size: int, max_new_tokens: int, generation_batch_size: int,
                 min_new_tokens: int | None = None, shard: Shard | None = None) -> tuple[list[dict], dict]:
    """Pick `batch_size` train prompts (seeded per round) and sample one response to each from `policy`
    (on whatever device it is).

    Queries start with the tokenizer's BOS token (when it has one), as every review did in
    pretraining. Each response stops at EOS or at its length limit (``response_limits``; see the
    module docstring); the row's ``max_new_tokens`` column records that limit. The behaviour
    log-probs of the kept tokens are recorded for PPO ratios and replay.
    Deterministic for (seed, round_, generation_batch_size, device) and the policy's weights, whether
    the policy was just loaded (rollout stage) or trained in this process (chunk stage). With `shard` (N processes)
    each process samples its generation batches and every process returns all rows, the same
    as one process (pipeline/parallel/shard.py).
    Returns: (rollout rows, metrics: device (this process's policy's, from its parameters),
    processes, rows, response_tokens, seconds and tokens_per_s of the sampling).
    """
    torch.manual_seed(round_seed(seed, round_, 0))
    train = [row for row in prompt_rows if row["split"] == "train"]
    picker = random.Random(round_seed(seed, round_, 1))
    chosen = picker.sample(train, batch_size) if batch_size <= len(train) else picker.choices(train, k=batch_size)
    return sample_rollouts(policy, tokenizer, chosen, policy_name=policy_name, run_id=run_id, round_=round_,
                           seed=seed, max_new_tokens=max_new_tokens, generation_batch_size=generation_batch_size,
                           min_new_tokens=min_new_tokens, shard=shard)


def sample_rollouts(policy, tokenizer, chosen: list[dict], *, policy_name: str, run_id: str, round_: int,
                    seed: int, max_new_tokens: int, generation_batch_size: int, min_new_tokens: int | None = None,
                    shard: Shard | None = None, progress: bool = True) -> tuple[list[dict], dict]:
    """Sample one response from `policy` to each of the `chosen` prompt rows (prompt_id, text), in order.

    The sampling half of :func:`rollout_with` (which picks the round's prompts first), also run by a
    caller that picks its own prompts (the sample-efficiency study's runner). The sampler's
    seed is round_seed(seed, round_, 2), the length limits' round_seed(seed, round_, 3); the global
    torch RNG is not touched. Returns (rollout rows, metrics) as rollout_with.
    """
    queries = [encode_query(tokenizer, row["text"]) for row in chosen]
    sample_seed = round_seed(seed, round_, 2)
    limits = response_limits(len(chosen), min_new_tokens=min_new_tokens, max_new_tokens=max_new_tokens,
                             seed=round_seed(seed, round_, 3))
    started = time.perf_counter()
    samples = sample_responses(
        policy, queries=queries, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
        max_new_tokens=max_new_tokens, seed=sample_seed, batch_size=generation_batch_size, progress=progress,
        shard=shard,
    )
    seconds = time.perf_counter() - started
    samples = [{"response_ids": s["response_ids"][:limit], "behaviour_logprobs": s["behaviour_logprobs"][:limit]}
               for s, limit in zip(samples, limits)]
    rows = [
        {"run_id": run_id, "round": round_, "rollout_id": f"r{round_:04d}-{i:05d}",
         "prompt_id": row["prompt_id"], "query": row["text"],
         "response": tokenizer.decode(sample["response_ids"], skip_special_tokens=True),
         "query_ids": query, "response_ids": sample["response_ids"],
         "behaviour_logprobs": sample["behaviour_logprobs"], "seed": sample_seed,
         "max_new_tokens": limit, "policy": policy_name}
        for i, (row, query, sample, limit) in enumerate(zip(chosen, queries, samples, limits))
    ]
    tokens = sum(len(s["response_ids"]) for s in samples)
    return rows, {"device": module_device(policy), "processes": (shard or Shard()).world_size,
                  "rows": len(rows), "response_tokens": tokens,
                  "seconds": seconds, "tokens_per_s": tokens / seconds if seconds > 0 else None}
