"""Data-parallel sampling under `accelerate launch` / torchrun: each process takes whole batches.

Generation batch b goes to process b % N. Every batch draws from its own generator, seeded from
(seed, b) by `batch_seed`, so a batch's samples do not depend on which process drew it or how
many there are; `Shard.gather` joins every process's batches in batch order, and the result is
the same list for any process count. The gather is torch.distributed's all_gather_object over a
gloo group (pickled Python lists through CPU tensors), so a GPU run needs no NCCL object gather.
A plain single-process run never touches torch.distributed.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass


def batch_seed(seed: int, batch: int) -> int:
    """The generator seed of generation batch `batch`.

    Batch 0 keeps `seed` itself, so a round that fits in one batch samples exactly as it did
    with one generator for the whole round; later batches get a SHA-256 of (seed, batch).
    """
    if batch == 0:
        return seed
    digest = hashlib.sha256(f"drlc-generation-batch:{seed}:{batch}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 2**31


@dataclass(frozen=True)
class Shard:
    """This process's place among `world_size` sampling processes (0 of 1 for a plain run)."""

    rank: int = 0
    world_size: int = 1

    @classmethod
    def from_environment(cls) -> Shard:
        """Shard() for a plain run; under a launcher (WORLD_SIZE > 1) join (or reuse) its process group."""
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return cls()
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo")  # env:// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE)
        return cls(rank=dist.get_rank(), world_size=dist.get_world_size())

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def batches(self, n_batches: int) -> range:
        """The generation batches this process samples: rank, rank + N, ..."""
        return range(self.rank, n_batches, self.world_size)

    def gather(self, local: dict[int, list]) -> list:
        """Every process's {batch index: results} joined in batch order; every process gets the whole list."""
        if self.world_size > 1:
            import torch.distributed as dist

            parts: list[dict[int, list] | None] = [None] * self.world_size
            dist.all_gather_object(parts, local)
            local = {index: results for part in parts for index, results in part.items()}
        return [item for index in sorted(local) for item in local[index]]

    def close(self) -> None:
        """Leave the process group (after the last gather); nothing for a plain run."""
        if self.world_size > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
