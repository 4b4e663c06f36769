"""The one process of a plain run, with `DataParallel`'s methods, so the PPO trainer has one code path.

Each method does what a single process does with no one to share with: prepare and full_state hand
the policy and optimizer back as they are, the batch is all this process's share, gathers and
sums return their input, a backward is `loss.backward()`, and clip_and_step clips with
`clip_grad_norm` and steps. The numbers are those of the trainer before data parallelism existed.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SingleProcess:
    """DataParallel for a run of one process (no WORLD_SIZE): rank 0 of 1, touching no process group."""

    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return True

    def prepare(self, policy: torch.nn.Module, optimizer: torch.optim.Optimizer, reference: torch.nn.Module, *,
                max_grad_norm: float | None = None, mini_batch_size: int | None = None):
        """(policy, optimizer, reference) unchanged: they train where they were loaded."""
        return policy, optimizer, reference

    def full_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        """(model, optimizer) themselves: they already hold the full weights and Adam state."""
        return model, optimizer

    def gradient_sync(self, model: torch.nn.Module, sync: bool):
        return contextlib.nullcontext()

    def skipped_forward(self, model: torch.nn.Module, last: bool) -> None:
        """Nothing: no sync waits on a skipped minibatch."""

    def backward(self, model: torch.nn.Module, loss: torch.Tensor) -> None:
        loss.backward()

    def clip_and_step(self, model: torch.nn.Module, optimizer, parameters: list, max_norm: float) -> float:
        """Clip the gradients of `parameters` to `max_norm` (clip_grad_norm), step; return the norm before."""
        norm = clip_grad_norm(parameters, max_norm)
        optimizer.step()
        return norm

    def shard(self, rows) -> list:
        """Every row: the one process's share is the whole batch."""
        return list(rows)

    def gather_rows(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def close(self) -> None:
        """Nothing: there is no process group to leave."""


def clip_grad_norm(parameters: list[torch.Tensor], max_norm: float) -> float:
    """Scale the gradients of `parameters` down to total norm `max_norm` if above it; return the norm before.

    torch.nn.utils.clip_grad_norm_'s arithmetic (coefficient max_norm / (norm + 1e-6), applied
    when below 1), minus its multiply by 1 when nothing is clipped: a pass over every gradient
    that cost 0.6% of a GPT-2 small update on CPU (benchmarks/ppo_update.py).
    """
    norm = torch.nn.utils.get_total_norm([p.grad for p in parameters])
    if (max_norm / (norm + 1e-6)).item() < 1.0:
        torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm)
    return norm.item()
