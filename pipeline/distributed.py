"""Data-parallel PPO through `accelerate.Accelerator`: which process this is, and what it shares.

A run started by `accelerate launch --multi_gpu --num_processes N` (or `torchrun --nproc_per_node N`)
has WORLD_SIZE=N, RANK and LOCAL_RANK in its environment. `DataParallel.from_environment()` then
builds an `Accelerator` (gloo when the machine has no CUDA device, nccl otherwise), and the
trainer `prepare`s the policy and optimizer with it: DDP wraps the policy and all-reduces
gradients during backward (`no_sync` while a backward batch accumulates). A plain
`python stages/ppo.py` has no WORLD_SIZE: it gets None, and neither accelerate nor
torch.distributed is touched, so a single-process run is unchanged.

Why not `accelerate launch --cpu --num_processes N`: accelerate 1.15 then starts ONE process
(its CPU multi-process path needs mpirun), so it would silently train single-process.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch

from pipeline.errors import ConfigError


def is_main_process() -> bool:
    """True for the process that writes outputs: rank 0, or the only process of a plain run.

    Reads the launcher's environment only, so the same answer as DataParallel.from_environment
    gives, without joining a process group.
    """
    return int(os.environ.get("WORLD_SIZE", "1")) <= 1 or int(os.environ.get("RANK", "0")) == 0


FSDP_REFUSAL = (
    "FSDP (ACCELERATE_USE_FSDP) is not supported by drlc's PPO loop yet. On CPU, accelerate 1.15 cannot "
    "shard: its AcceleratorState switches to FSDP only for a GPU-family process group, so a CPU launch "
    "(MULTI_CPU, gloo) would silently run plain DDP. On GPUs, drlc's checkpoint (unwrap, not a gathered "
    "state dict) and its sync after a skipped minibatch are not written for sharded parameters. "
    "Launch with configs/accelerate/multi_gpu.yaml.")


@dataclass(frozen=True)
class DataParallel:
    """This process's place among `world_size` data-parallel processes, and its Accelerator."""

    rank: int
    world_size: int
    device: torch.device
    accelerator: object  # accelerate.Accelerator (imported only by multi-process runs)

    @classmethod
    def from_environment(cls) -> DataParallel | None:
        """Build the launcher's Accelerator, or return None when the run has a single process.

        drlc's precision is ppo.mixed_precision (its own autocast in pipeline.scoring), so the
        Accelerator runs with mixed_precision "no" whatever the launch config says.
        Raises ConfigError under an accelerate DeepSpeed or FSDP config (docs/scale-out.md), and
        when accelerate sees another process count than the launcher started.
        """
        if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() in ("1", "true"):
            raise ConfigError("DeepSpeed (ACCELERATE_USE_DEEPSPEED) is not supported by drlc's PPO loop yet: it "
                              "is not installed or tested here. Launch with configs/accelerate/multi_gpu.yaml.")
        if os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true"):
            raise ConfigError(FSDP_REFUSAL)
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size <= 1:
            return None
        from accelerate import Accelerator  # imported only by multi-process runs

        accelerator = Accelerator(cpu=not torch.cuda.is_available(), mixed_precision="no")
        if accelerator.num_processes != world_size:
            raise ConfigError(f"The launcher started {world_size} processes but accelerate sees "
                              f"{accelerator.num_processes} ({accelerator.distributed_type}): each would train "
                              "alone. Launch with configs/accelerate/multi_gpu.yaml or --multi_gpu.")
        return cls(rank=accelerator.process_index, world_size=accelerator.num_processes,
                   device=accelerator.device, accelerator=accelerator)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def prepare(self, policy: torch.nn.Module, optimizer: torch.optim.Optimizer):
        """(model, optimizer) wrapped for this launch (DDP for a plain multi-process one)."""
        return self.accelerator.prepare(policy, optimizer)

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The policy module inside a prepared model (its parameters are the full ones under DDP)."""
        return self.accelerator.unwrap_model(model)

    def gradient_sync(self, model: torch.nn.Module, sync: bool):
        """Context for one forward+backward: all-reduce its gradients (sync) or only accumulate them."""
        return contextlib.nullcontext() if sync else self.accelerator.no_sync(model)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of this process's loss. DDP averages the processes' gradients, so the trainer
        scales each loss by world_size · its token share (docs/ppo.md, Multi-process)."""
        self.accelerator.backward(loss)

    def clip_grad_norm_(self, parameters: list, max_norm: float) -> torch.Tensor:
        return self.accelerator.clip_grad_norm_(parameters, max_norm)

    def shard(self, rows: list) -> list:
        """This process's contiguous equal share of `rows` (len(rows) must divide by world_size)."""
        assert len(rows) % self.world_size == 0, (len(rows), self.world_size)
        size = len(rows) // self.world_size
        return list(rows[self.rank * size : (self.rank + 1) * size])

    def gather_rows(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate every process's `tensor` (same shape everywhere) along dim 0, in rank order.

        The inverse of `shard`: gathering per-shard results gives the whole batch's tensor.
        """
        return self.accelerator.gather(tensor.contiguous())

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` summed over the processes (a new tensor)."""
        return self.accelerator.reduce(tensor, reduction="sum")

    def close(self) -> None:
        """Wait for every process, then leave the process group.

        Without it a process can exit while gloo's threads still run, and the C++ runtime aborts
        it ("terminate called without an active exception", exit code -6) after its work is done.
        """
        import torch.distributed as dist

        self.accelerator.wait_for_everyone()
        dist.destroy_process_group()
