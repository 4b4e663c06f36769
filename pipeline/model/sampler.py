"""The rollout sampler protocol: what `pipeline.steps.rollout.sample_rollouts` asks of whatever samples a round.

Two implementations: :class:`HFSampler`, drlc's own sampler (pipeline/model/sampling.py) around a torch policy, and
`pipeline.model.vllm_engine.VLLMEngine` (rollout.engine vllm). A rollout of P prompts and G samples each has
P · G rows, row i = sample k = i % G of prompt p = i // G (a prompt's samples are consecutive rows).
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from pipeline.core.device import module_device
from pipeline.model.sampling import sample_responses
from pipeline.parallel.shard import Shard


@runtime_checkable
class RolloutSampler(Protocol):
    """Samples the responses of one rollout (docs/rollout-engines.md)."""

    def sample_rows(self, queries: list[list[int]], *, seeds: list[int], limits: list[int], eos_id: int | None,
                    pad_id: int | None) -> list[dict]:
        """Sample len(queries) · G rows, G = len(seeds): queries[p] is prompt p's token ids, seeds[k] the stream
        seed of sample index k, limits[i] row i's new-token limit; a row stops after `eos_id` (kept).

        Returns one dict per row, in row order: response_ids, behaviour_logprobs (of the kept tokens), seed (the
        seed recorded in the row's `seed` column) and, for an external engine, engine_logprobs (its own log-probs
        of the sampled tokens, which make the PPO stage recompute the old log-probs).
        """
        ...

    def sampler_info(self) -> dict:
        """The rollout metrics' fields naming what sampled: device (a string), processes and, for an external
        engine, engine (its name)."""
        ...


class HFSampler:
    """drlc's sampler on a torch policy: stream k samples every prompt with `sample_responses` (seed seeds[k], in
    generation batches of `batch_size`, split over `shard`'s processes) to the longest limit; each row is then cut
    to its own limit (the first L tokens of a longer sample are a sample of at most L: pipeline/steps/rollout.py)."""

    def __init__(self, policy: torch.nn.Module, *, batch_size: int, progress: bool = True,
                 shard: Shard | None = None):
        self.policy, self.batch_size, self.progress, self.shard = policy, batch_size, progress, shard or Shard()

    def sample_rows(self, queries: list[list[int]], *, seeds: list[int], limits: list[int], eos_id: int | None,
                    pad_id: int | None) -> list[dict]:
        by_index = [sample_responses(self.policy, queries=queries, eos_id=eos_id, pad_id=pad_id,
                                     max_new_tokens=max(limits, default=0), seed=stream, batch_size=self.batch_size,
                                     progress=self.progress, shard=self.shard)
                    for stream in seeds]  # by_index[k][p]: sample k of prompt p
        group = len(seeds)
        return [{"response_ids": by_index[i % group][i // group]["response_ids"][:limit],
                 "behaviour_logprobs": by_index[i % group][i // group]["behaviour_logprobs"][:limit],
                 "seed": seeds[i % group]}
                for i, limit in enumerate(limits)]

    def sampler_info(self) -> dict:
        return {"device": module_device(self.policy), "processes": self.shard.world_size}


def as_sampler(policy_or_sampler, *, generation_batch_size: int, progress: bool = True,
               shard: Shard | None = None) -> RolloutSampler:
    """A torch policy wrapped in :class:`HFSampler` (generation_batch_size, progress, shard are its settings); a
    RolloutSampler (a VLLMEngine) as it is, which samples by its own settings. Raises TypeError for anything else."""
    if isinstance(policy_or_sampler, torch.nn.Module):
        return HFSampler(policy_or_sampler, batch_size=generation_batch_size, progress=progress, shard=shard)
    if isinstance(policy_or_sampler, RolloutSampler):
        return policy_or_sampler
    raise TypeError(f"sample_rollouts got a {type(policy_or_sampler).__module__}.{type(policy_or_sampler).__qualname__}"
                    ": expected a torch policy (torch.nn.Module) or a rollout sampler with sample_rows and "
                    "sampler_info (pipeline.model.sampler.RolloutSampler, e.g. a VLLMEngine).")
