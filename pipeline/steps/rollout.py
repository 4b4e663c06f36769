"""`rollout` stage: sample responses to a batch of train prompts from the current policy."""
from __future__ import annotations

import random

import torch

from pipeline.policy import load_policy, sample_responses


def round_seed(seed: int, round_: int, stream: int) -> int:
    """A distinct, reproducible seed per (run seed, round, purpose)."""
    return (seed * 1_000_003 + round_ * 101 + stream) % (2**31)


def rollout(prompt_rows: list[dict], *, policy_dir: str, policy_name: str, run_id: str, round_: int,
            seed: int, batch_size: int, max_new_tokens: int, generation_batch_size: int) -> list[dict]:
    """Pick `batch_size` train prompts (seeded per round) and sample one response to each.

    Queries start with the tokenizer's BOS token, as every review did in pretraining. The
    behaviour log-probs of the sampled tokens are recorded for PPO ratios and replay.
    """
    torch.manual_seed(round_seed(seed, round_, 0))
    train = [row for row in prompt_rows if row["split"] == "train"]
    picker = random.Random(round_seed(seed, round_, 1))
    chosen = picker.sample(train, batch_size) if batch_size <= len(train) else picker.choices(train, k=batch_size)
    policy, tokenizer = load_policy(policy_dir)
    queries = [[tokenizer.bos_token_id] + tokenizer.encode(row["text"]) for row in chosen]
    sample_seed = round_seed(seed, round_, 2)
    samples = sample_responses(
        policy, queries=queries, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
        max_new_tokens=max_new_tokens, seed=sample_seed, batch_size=generation_batch_size,
    )
    return [
        {"run_id": run_id, "round": round_, "rollout_id": f"r{round_:04d}-{i:05d}",
         "prompt_id": row["prompt_id"], "query": row["text"],
         "response": tokenizer.decode(sample["response_ids"], skip_special_tokens=True),
         "query_ids": query, "response_ids": sample["response_ids"],
         "behaviour_logprobs": sample["behaviour_logprobs"], "seed": sample_seed,
         "max_new_tokens": max_new_tokens, "policy": policy_name}
        for i, (row, query, sample) in enumerate(zip(chosen, queries, samples))
    ]
