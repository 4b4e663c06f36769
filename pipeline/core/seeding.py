"""Seeds of a run: one distinct, reproducible seed per (run seed, round, purpose).

Streams in use: 0 torch's global seed and 1 the prompt picker (rollout), 2 the sampler
(rollout), 3 the response-length limits (rollout) and torch's global seed (ppo), 4 the
minibatch shuffle (ppo), 5 fresh LoRA adapters (ppo), 9 the sample-efficiency evaluation
sampler (benchmarks).
"""
from __future__ import annotations


def round_seed(seed: int, round_: int, stream: int) -> int:
    """A distinct, reproducible seed per (run seed, round, purpose)."""
    return (seed * 1_000_003 + round_ * 101 + stream) % (2**31)
