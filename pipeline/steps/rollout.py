"""`rollout` stage: sample responses to a batch of train prompts from the current policy.

Response lengths: with ``rollout.min_new_tokens`` set, each response gets its own limit drawn
uniformly from [min_new_tokens, max_new_tokens] (both included) by a seeded generator, as the
paper's runs did with legacy TRL's LengthSampler (sentiment 15-20 new tokens, detoxification
10-14; note LengthSampler(a, b) itself draws from range(a, b), which excludes b). The batch is
sampled once with max_new_tokens and each response is then cut to its limit: tokens are drawn
one at a time, so the first L tokens of a longer sample have exactly the distribution of a
sample stopped after L tokens, and their behaviour log-probs are unchanged by the cut.

Groups: with ``rollout.samples_per_prompt`` G > 1 (the value-free algorithms, docs/algorithms.md) the round
picks batch_size / G prompts and samples G responses to each; sample k of every prompt comes from its own
sampler stream (``sample_seeds``; stream 0 is the G = 1 sampler's), and a group's rows are consecutive, with
their `group_index` and `sample_index` recorded. G = 1 writes exactly the table it always did (no such columns).

Engines (``rollout.engine``): hf, drlc's sampler (pipeline/model/sampling.py), or vllm (pipeline/model/vllm_engine.py),
with the same prompts, length limits and groups. vLLM takes one request per response: the response of prompt p
in stream k is seeded with batch_seed(sample_seeds[k], p), as if each prompt were a generation batch of its own,
and that seed is the row's ``seed``; it stops at the response's own limit instead of being cut. Its rows add
``engine_logprobs`` (vLLM's log-probs of the sampled tokens; ``behaviour_logprobs`` holds the same numbers), which
tells the PPO stage to recompute the old log-probs with the training model (docs/rollout-engines.md). Both sample
through one protocol, pipeline.model.sampler.RolloutSampler: a torch policy is wrapped in its HFSampler, an
engine is passed as it is.
"""
from __future__ import annotations

import random
import time

import torch

from pipeline.core.seeding import round_seed
from pipeline.model.policy import load_policy
from pipeline.model.sampler import as_sampler
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


def sample_seeds(sample_seed: int, samples_per_prompt: int) -> list[int]:
    """The sampler seed of each sample index: index 0 keeps `sample_seed` (so G = 1 is unchanged), index k > 0
    gets round_seed(sample_seed, k, 2), a stream of its own."""
    return [sample_seed] + [round_seed(sample_seed, k, 2) for k in range(1, samples_per_prompt)]


def rollout(prompt_rows: list[dict], *, policy_dir: str, policy_name: str, run_id: str, round_: int,
            seed: int, batch_size: int, max_new_tokens: int, generation_batch_size: int,
            min_new_tokens: int | None = None, device: str | torch.device = "cpu",
            samples_per_prompt: int = 1) -> list[dict]:
    """The rows of `rollout_round` (without its metrics)."""
    return rollout_round(prompt_rows, policy_dir=policy_dir, policy_name=policy_name, run_id=run_id, round_=round_,
                         seed=seed, batch_size=batch_size, max_new_tokens=max_new_tokens,
                         generation_batch_size=generation_batch_size, min_new_tokens=min_new_tokens,
                         device=device, samples_per_prompt=samples_per_prompt)[0]


def rollout_round(prompt_rows: list[dict], *, policy_dir: str, policy_name: str, run_id: str, round_: int,
                  seed: int, batch_size: int, max_new_tokens: int, generation_batch_size: int,
                  min_new_tokens: int | None = None, device: str | torch.device = "cpu",
                  shard: Shard | None = None, samples_per_prompt: int = 1) -> tuple[list[dict], dict]:
    """Load the policy of `policy_dir` onto `device` and run :func:`rollout_with` on it (the rollout stage;
    with rollout.engine vllm, pipeline/steps/engine_rollout.py instead)."""
    policy, tokenizer = load_policy(policy_dir)
    return rollout_with(policy.to(device), tokenizer, prompt_rows, policy_name=policy_name, run_id=run_id,
                        round_=round_, seed=seed, batch_size=batch_size, max_new_tokens=max_new_tokens,
                        generation_batch_size=generation_batch_size, min_new_tokens=min_new_tokens, shard=shard,
                        samples_per_prompt=samples_per_prompt)


def rollout_with(policy, tokenizer, prompt_rows: list[dict], *, policy_name: str, run_id: str, round_: int,
                 seed: int, batch_size: int, max_new_tokens: int, generation_batch_size: int,
                 min_new_tokens: int | None = None, shard: Shard | None = None,
                 samples_per_prompt: int = 1) -> tuple[list[dict], dict]:
    """Pick batch_size / samples_per_prompt train prompts (seeded per round) and sample samples_per_prompt
    responses to each from `policy` (on whatever device it is): batch_size rows.

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
    if batch_size % samples_per_prompt:
        raise ValueError(f"rollout.batch_size = {batch_size} is not a whole number of groups of "
                         f"rollout.samples_per_prompt = {samples_per_prompt}.")
    n_prompts = batch_size // samples_per_prompt
    picker = random.Random(round_seed(seed, round_, 1))
    chosen = picker.sample(train, n_prompts) if n_prompts <= len(train) else picker.choices(train, k=n_prompts)
    return sample_rollouts(policy, tokenizer, chosen, policy_name=policy_name, run_id=run_id, round_=round_,
                           seed=seed, max_new_tokens=max_new_tokens, generation_batch_size=generation_batch_size,
                           min_new_tokens=min_new_tokens, shard=shard, samples_per_prompt=samples_per_prompt)


def sample_rollouts(policy, tokenizer, chosen: list[dict], *, policy_name: str, run_id: str, round_: int,
                    seed: int, max_new_tokens: int, generation_batch_size: int, min_new_tokens: int | None = None,
                    shard: Shard | None = None, progress: bool = True,
                    samples_per_prompt: int = 1) -> tuple[list[dict], dict]:
    """Sample `samples_per_prompt` responses from `policy` to each of the `chosen` prompt rows (prompt_id, text),
    in order; a prompt's responses are consecutive rows. `policy`: a torch policy (drlc's sampler, with
    generation_batch_size, progress and shard) or a rollout sampler such as a VLLMEngine
    (pipeline.model.sampler.as_sampler; anything else raises TypeError).

    The sampling half of :func:`rollout_with` (which picks the round's prompts first), also run by a
    caller that picks its own prompts (the sample-efficiency study's runner). The sampler's
    seed is round_seed(seed, round_, 2), the length limits' round_seed(seed, round_, 3); the global
    torch RNG is not touched. Returns (rollout rows, metrics) as rollout_with.
    """
    sampler = as_sampler(policy, generation_batch_size=generation_batch_size, progress=progress, shard=shard)
    group = samples_per_prompt
    queries = [encode_query(tokenizer, row["text"]) for row in chosen]
    seeds = sample_seeds(round_seed(seed, round_, 2), group)
    limits = response_limits(len(chosen) * group, min_new_tokens=min_new_tokens, max_new_tokens=max_new_tokens,
                             seed=round_seed(seed, round_, 3))
    started = time.perf_counter()
    samples = sampler.sample_rows(queries, seeds=seeds, limits=limits, eos_id=tokenizer.eos_token_id,
                                  pad_id=tokenizer.pad_token_id)
    seconds = time.perf_counter() - started
    if len(samples) != len(limits):
        raise ValueError(f"{type(sampler).__qualname__}.sample_rows returned {len(samples)} samples for "
                         f"{len(limits)} rows ({len(chosen)} prompts x {group}): a sampler returns one per row.")
    rows = _rows(tokenizer, chosen, queries, samples, limits=limits, group=group, policy_name=policy_name,
                 run_id=run_id, round_=round_)
    tokens = sum(len(s["response_ids"]) for s in samples)
    return rows, {**sampler.sampler_info(), "rows": len(rows), "response_tokens": tokens,
                  "seconds": seconds, "tokens_per_s": tokens / seconds if seconds > 0 else None}


def _rows(tokenizer, chosen, queries, samples, *, limits, group, policy_name, run_id, round_) -> list[dict]:
    """The rollout rows of `samples` (row i = sample k = i % G of prompt p = i // G, as the sampler returned them)."""
    return [
        {"run_id": run_id, "round": round_, "rollout_id": f"r{round_:04d}-{i:05d}",
         "prompt_id": chosen[i // group]["prompt_id"], "query": chosen[i // group]["text"],
         "response": tokenizer.decode(sample["response_ids"], skip_special_tokens=True),
         "query_ids": queries[i // group], "response_ids": sample["response_ids"],
         "behaviour_logprobs": sample["behaviour_logprobs"], "seed": sample["seed"],
         "max_new_tokens": limit, "policy": policy_name,
         **({"group_index": i // group, "sample_index": i % group} if group > 1 else {}),
         **({"engine_logprobs": sample["engine_logprobs"]} if "engine_logprobs" in sample else {})}
        for i, (sample, limit) in enumerate(zip(samples, limits))
    ]
