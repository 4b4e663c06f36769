"""Data-parallel PPO: which process this is, and the three collectives the trainer needs.

A run started by `accelerate launch --multi_gpu --num_processes N` (or `torchrun --nproc_per_node N`)
has WORLD_SIZE=N, RANK and LOCAL_RANK in its environment. `DataParallel.from_environment()` then
joins the process group through accelerate's PartialState: gloo when the machine has no CUDA
device, nccl otherwise. A plain `python stages/ppo.py` has no WORLD_SIZE: it gets None, and
neither accelerate nor torch.distributed is touched, so a single-process run is unchanged.

Why not `accelerate launch --cpu --num_processes N`: accelerate 1.15 then starts ONE process
(its CPU multi-process path needs mpirun), so it would silently train single-process.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch


def is_main_process() -> bool:
    """True for the process that writes outputs: rank 0, or the only process of a plain run.

    Reads the launcher's environment only, so the same answer as DataParallel.from_environment
    gives, without joining a process group.
    """
    return int(os.environ.get("WORLD_SIZE", "1")) <= 1 or int(os.environ.get("RANK", "0")) == 0


@dataclass(frozen=True)
class DataParallel:
    """This process's place among `world_size` data-parallel processes (rank 0 is the main one)."""

    rank: int
    world_size: int
    device: torch.device

    @classmethod
    def from_environment(cls) -> DataParallel | None:
        """Join the launcher's process group, or return None when the run has a single process.

        Raises ConfigError under an accelerate DeepSpeed config: drlc's loop replicates the model
        and all-reduces gradients itself, so ZeRO would shard nothing (docs/scale-out.md).
        """
        if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() in ("1", "true"):
            from pipeline.errors import ConfigError

            raise ConfigError("DeepSpeed (ACCELERATE_USE_DEEPSPEED) is not supported by drlc's PPO loop yet: it "
                              "would replicate, not shard, the model. Launch with configs/accelerate/multi_gpu.yaml.")
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return None
        from accelerate import PartialState  # imported only by multi-process runs

        state = PartialState(cpu=not torch.cuda.is_available())
        return cls(rank=state.process_index, world_size=state.num_processes, device=state.device)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, rows: list) -> list:
        """This process's contiguous equal share of `rows` (len(rows) must divide by world_size)."""
        assert len(rows) % self.world_size == 0, (len(rows), self.world_size)
        size = len(rows) // self.world_size
        return list(rows[self.rank * size : (self.rank + 1) * size])

    def gather_rows(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate every process's `tensor` (same shape everywhere) along dim 0, in rank order.

        The inverse of `shard`: gathering per-shard results gives the whole batch's tensor.
        """
        import torch.distributed as dist

        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous())
        return torch.cat(parts)

    def close(self) -> None:
        """Wait for every process, then leave the process group.

        Without it a process can exit while gloo's threads still run, and the C++ runtime aborts
        it ("terminate called without an active exception", exit code -6) after its work is done.
        """
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum `tensor` over the processes, in place; returns it."""
        import torch.distributed as dist

        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def all_reduce_gradients(self, parameters: list[torch.nn.Parameter]) -> None:
        """Replace each parameter's .grad by its sum over the processes (one flat all-reduce).

        The trainer scales each process's loss by its share of the minibatch's tokens, so the
        sum is the gradient of the whole minibatch's token mean (see docs/ppo.md, Multi-process).
        """
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
        flat = self.all_reduce_sum(torch.cat([g.reshape(-1) for g in grads]))
        offset = 0
        for param, grad in zip(parameters, grads):
            param.grad = flat[offset : offset + grad.numel()].view_as(grad).clone()
            offset += grad.numel()
