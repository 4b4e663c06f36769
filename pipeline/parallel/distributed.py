"""Data-parallel PPO through `accelerate.Accelerator`: which process this is, and what it shares.

A run started by `accelerate launch --multi_gpu --num_processes N` (or `torchrun --nproc_per_node N`)
has WORLD_SIZE=N, RANK and LOCAL_RANK in its environment. `DataParallel.from_environment()` then
builds an `Accelerator` (gloo when the machine has no CUDA device, nccl otherwise), and the
PPO round `prepare`s the policy, optimizer and reference with it:
- DDP (a plain launch, configs/accelerate/multi_gpu.yaml): the policy all-reduces gradients
  during backward (`no_sync` while a backward batch accumulates).
- FSDP2 (configs/accelerate/fsdp2.yaml): `torch.distributed.fsdp.fully_shard` per transformer
  block and for the whole policy, and for a separate reference; each backward reduce-scatters
  into sharded gradients. On GPUs accelerate's prepare applies it; on CPU accelerate 1.15 does
  not (see DataParallel._prepare_fsdp2), so drlc calls fully_shard itself.
- DeepSpeed ZeRO-1/2/3 (configs/accelerate/zero{1,2,3}.yaml): accelerate's prepare builds the
  engine from the launch config's DeepSpeedPlugin, with what drlc owns filled in: no managed
  accumulation (`managed_gradient_accumulation: false`, so drlc's backwards only accumulate and
  the engine's step is the boundary that reduces, clips at ppo.max_grad_norm and steps), no loss
  scaling by accumulation steps. ZeRO-3 shards a separate reference in its own inference engine.
  On CPU drlc passes accelerate the gloo backend itself (see DataParallel.from_environment).
Every process then calls `full_state`, which gathers the full weights and Adam state for the
checkpoint, in the layout of a single process. A plain `python stages/ppo.py` has no
WORLD_SIZE: it gets None, and neither accelerate nor torch.distributed is touched, so a
single-process run is unchanged; it trains with pipeline.parallel.single.SingleProcess, which has
DataParallel's methods.

Why not `accelerate launch --cpu --num_processes N`: accelerate 1.15 then starts ONE process
(its CPU multi-process path needs mpirun), so it would silently train single-process.
"""
from __future__ import annotations

import contextlib
import os
import sys
import warnings
from dataclasses import dataclass, field

import torch

from pipeline.core.errors import ConfigError
from pipeline.parallel.plain_state import (
    indexed_optimizer_state,
    materialized,
    meta_copy,
    named_optimizer_state,
    parameter_names,
)


def is_main_process() -> bool:
    """True for the process that writes outputs: rank 0, or the only process of a plain run.

    Reads the launcher's environment only, so the same answer as DataParallel.from_environment
    gives, without joining a process group.
    """
    return int(os.environ.get("WORLD_SIZE", "1")) <= 1 or int(os.environ.get("RANK", "0")) == 0


def sharding_from_environment() -> str:
    """The launch config's kind of data parallelism, "ddp", "fsdp2" or "deepspeed", read from the
    variables `accelerate launch` sets.

    Raises ConfigError for FSDP version 1 (drlc's checkpoint gathering is written for FSDP2's DTensors).
    """
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() in ("1", "true"):
        return "deepspeed"
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true"):
        if os.environ.get("FSDP_VERSION", "1") != "2":
            raise ConfigError(f"FSDP version {os.environ.get('FSDP_VERSION', '1')} is not supported by drlc's PPO "
                              "loop: set fsdp_version: 2 in the accelerate config (configs/accelerate/fsdp2.yaml).")
        return "fsdp2"
    return "ddp"


@dataclass(frozen=True)
class DataParallel:
    """This process's place among `world_size` data-parallel processes, and its Accelerator."""

    rank: int
    world_size: int
    device: torch.device
    accelerator: object  # accelerate.Accelerator (imported only by multi-process runs)
    sharding: str = "ddp"  # "ddp", "fsdp2" or "deepspeed"
    _plain: dict = field(default_factory=dict, repr=False)  # id(prepared model) -> register_plain's plain copy

    @classmethod
    def from_environment(cls) -> DataParallel | None:
        """Build the launcher's Accelerator, or return None when the run has a single process.

        drlc's precision is ppo.mixed_precision (its own autocast in pipeline.model.logprobs), so the
        Accelerator runs with mixed_precision "no" whatever the launch config says.
        DeepSpeed: accelerate 1.15 selects it only with cpu=False, and then, without CUDA, finds no
        backend and counts one process; passing gloo makes it start DeepSpeed's comm over gloo
        (deepspeed's CPU accelerator picks gloo when oneCCL is not installed).
        Raises ConfigError for FSDP version 1, for a DeepSpeed launch without deepspeed installed,
        and when accelerate sees another process count than the launcher started.
        """
        sharding = sharding_from_environment()
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size <= 1:
            return None
        from accelerate import Accelerator  # imported only by multi-process runs

        accelerator = Accelerator(mixed_precision="no", **_accelerator_options(sharding))
        if sharding == "deepspeed":
            from pipeline.parallel.deepspeed_zero import load_models_whole

            load_models_whole(accelerator.state.deepspeed_plugin)
        if accelerator.num_processes != world_size:
            raise ConfigError(f"The launcher started {world_size} processes but accelerate sees "
                              f"{accelerator.num_processes} ({accelerator.distributed_type}): each would train "
                              "alone. Launch with configs/accelerate/multi_gpu.yaml or --multi_gpu.")
        return cls(rank=accelerator.process_index, world_size=accelerator.num_processes,
                   device=accelerator.device, accelerator=accelerator, sharding=sharding)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def prepare(self, policy: torch.nn.Module, optimizer: torch.optim.Optimizer, reference: torch.nn.Module, *,
                max_grad_norm: float | None = None, mini_batch_size: int | None = None):
        """(model, optimizer, reference) for this launch: DDP, FSDP2 or a DeepSpeed engine.

        `optimizer` may hold the previous round's state (loaded before prepare); it is kept.
        FSDP2 and ZeRO-3 shard a separate reference for inference too; the reference of a LoRA
        policy (the policy with adapters off) is the prepared policy itself.
        max_grad_norm (ppo.max_grad_norm) and mini_batch_size (ppo.mini_batch_size): DeepSpeed
        only, whose engine clips inside its step and wants a micro-batch size in its config.
        """
        separate = getattr(reference, "policy", None) is not policy  # not pipeline.model.reference.AdaptersDisabled
        if self.sharding == "ddp":
            model, optimizer = self.accelerator.prepare(policy, optimizer)
            return model, optimizer, reference.to(self.device)
        if self.sharding == "deepspeed":
            from pipeline.parallel.deepspeed_zero import prepare_zero

            return prepare_zero(self, policy, optimizer, reference, separate, max_grad_norm=max_grad_norm,
                                micro_batch_size=(mini_batch_size or self.world_size) // self.world_size)
        return self._prepare_fsdp2(policy, optimizer, reference, separate)

    def _prepare_fsdp2(self, policy, optimizer, reference, separate: bool):
        """FSDP2 (`fully_shard`): through accelerate on GPUs, drlc's own `fully_shard` calls on CPU.

        accelerate 1.15 switches to FSDP only for a GPU-family process group (AcceleratorState),
        so on CPU (gloo) its prepare would return plain DDP; drlc then shards as accelerate's
        FSDP2 does (each transformer block, then the whole model), with accelerate's plugin
        settings from the launch config. The optimizer state is set aside as full tensors and
        loaded back into the sharded optimizer by parameter name.
        """
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        plugin = self._fsdp2_plugin()
        if plugin.transformer_cls_names_to_wrap is None:  # accelerate would look on the policy, which has none
            plugin.transformer_cls_names_to_wrap = list(getattr(policy.lm, "_no_split_modules", None) or ())
        names = parameter_names(policy)
        full_state = named_optimizer_state(optimizer.state_dict(), optimizer, names)
        optimizer.state.clear()
        plain = meta_copy(policy)  # before fully_shard turns the policy's parameters into DTensors
        if _accelerate_shards(self.accelerator):
            model, optimizer = self.accelerator.prepare(policy, optimizer)
        else:
            model = _fully_shard(policy.to(self.device), plugin)
            _repoint(optimizer, names, dict(model.named_parameters()))
        self.register_plain(model, plain)
        if full_state["state"]:
            set_optimizer_state_dict(model, _torch_optimizer(optimizer), full_state,
                                     options=StateDictOptions(full_state_dict=True))
        if separate:
            reference = _fully_shard(reference.to(self.device), plugin, inference=True)
        if self.is_main:
            held = _sharding_summary(reference) if separate else "the policy with adapters off"
            print(f"drlc: FSDP2 over {self.world_size} processes: policy {_sharding_summary(model)}; "
                  f"reference {held}", file=sys.stderr)
        return model, optimizer, reference

    def _fsdp2_plugin(self):
        """accelerate's FSDP plugin as the launch config set it (ACCELERATE_*/FSDP_* variables); on
        CPU accelerate's state holds none, so it is read from those variables here."""
        from accelerate.utils import FullyShardedDataParallelPlugin

        return getattr(self.accelerator.state, "fsdp_plugin", None) or FullyShardedDataParallelPlugin()

    def full_state(self, model: torch.nn.Module, optimizer) -> tuple[torch.nn.Module | None, dict | None]:
        """(plain policy with the full weights, full optimizer state dict) on the main process, else (None, None).

        The same module and the same `optimizer.state_dict()` layout a single process has, for any
        process count and sharding, so a 1-process round resumes from it. Every process must call it
        (FSDP2 gathers its shards collectively).
        """
        if self.sharding == "ddp":
            return (self.accelerator.unwrap_model(model), optimizer.state_dict()) if self.is_main else (None, None)
        if self.sharding == "deepspeed":
            from pipeline.parallel.deepspeed_zero import full_zero_state

            return full_zero_state(self, model)
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)  # full tensors on rank 0 only
        weights = get_model_state_dict(model, options=options)
        optimizer_state = get_optimizer_state_dict(model, _torch_optimizer(optimizer), options=options)
        if not self.is_main:
            return None, None
        return materialized(self.plain_of(model), weights), indexed_optimizer_state(optimizer_state)

    def register_plain(self, model: torch.nn.Module, plain) -> None:
        """Keep `plain`, what full_state needs of the policy as it was before `prepare` turned it into
        `model` (FSDP2: its meta copy; DeepSpeed: deepspeed_zero.PlainPolicy)."""
        self._plain[id(model)] = plain

    def plain_of(self, model: torch.nn.Module):
        """What register_plain kept for the prepared `model`."""
        return self._plain[id(model)]

    def gradient_sync(self, model: torch.nn.Module, sync: bool):
        """Context for one forward+backward: all-reduce its gradients (sync) or only accumulate them.

        FSDP2 always syncs: each backward reduce-scatters into the sharded gradients, which then
        accumulate, so a step whose last minibatch is skipped has nothing left to finish.
        DeepSpeed: the engine's step is the boundary (unmanaged accumulation); ZeRO-1 reduces
        there, ZeRO-2/3 reduce-scatter in every backward, and no_sync is not allowed.
        """
        if sync or self.sharding in ("fsdp2", "deepspeed"):
            return contextlib.nullcontext()
        return self.accelerator.no_sync(model)

    def skipped_forward(self, model: torch.nn.Module, last: bool) -> None:
        """Leave the gradient sync complete after a forward whose loss is not backpropagated.

        DDP, the step's last minibatch: all-reduce the gradients accumulated so far with a
        backward that adds exactly 0 to every trainable parameter's grad (a 0·loss backward could
        add NaN, 0·inf, in the very case the ratio guard exists for). FSDP2: the forward left the
        root's parameters unsharded (it reshards after backward), and an optimizer step would not
        reach them; reshard every unit so the next forward all-gathers the updated shards.
        DeepSpeed: nothing; the engine's step reduces whatever the backwards accumulated, and a
        ZeRO-3 forward releases its gathered parameters after each module.
        """
        if self.sharding == "deepspeed":
            return
        if self.sharding == "fsdp2":
            from torch.distributed.fsdp import FSDPModule

            for module in model.modules():
                if isinstance(module, FSDPModule):
                    module.reshard()
        elif last:
            self.backward(model, sum(p.sum() for p in model.parameters() if p.requires_grad) * 0.0)

    def backward(self, model: torch.nn.Module, loss: torch.Tensor) -> None:
        """Backward of this process's loss. DDP, FSDP2 and ZeRO average the processes' gradients, so
        the trainer scales each loss by world_size · its token share (docs/ppo.md, Multi-process).

        DeepSpeed: the engine's own backward (accelerate's would also step), which only
        accumulates; the loss is already divided by the accumulation steps (scale_wrt_gas=False).
        """
        if self.sharding == "deepspeed":
            model.backward(loss, scale_wrt_gas=False)
        else:
            self.accelerator.backward(loss)

    def clip_and_step(self, model: torch.nn.Module, optimizer, parameters: list, max_norm: float) -> float:
        """Clip the gradients of `parameters` to `max_norm`, step `optimizer`; return the total norm
        before clipping (one process: SingleProcess.clip_and_step, pipeline.parallel.single).

        DDP and FSDP2: accelerate's clip (DTensor-aware under FSDP2). DeepSpeed: the engine's step,
        which reduces, clips at the ppo.max_grad_norm prepare put in its config and steps; its
        norm is the global one it clipped with.
        """
        if self.sharding == "deepspeed":
            model.step()
            return float(model.get_global_grad_norm())
        norm = self.accelerator.clip_grad_norm_(parameters, max_norm)
        optimizer.step()
        return (norm.full_tensor() if hasattr(norm, "full_tensor") else norm).item()

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


def _accelerator_options(sharding: str) -> dict:
    """Accelerator arguments for this launch: cpu without CUDA (DDP, FSDP2); DeepSpeed: cpu=False,
    with gloo named without CUDA (from_environment says why)."""
    if sharding != "deepspeed":
        return {"cpu": not torch.cuda.is_available()}
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        raise ConfigError("The launch config asks for DeepSpeed (distributed_type: DEEPSPEED) but deepspeed is not "
                          "installed: pip install -c constraints.txt -e '.[deepspeed]', or launch with "
                          "configs/accelerate/fsdp2.yaml.")
    if torch.cuda.is_available():
        return {"cpu": False}
    from accelerate.utils import InitProcessGroupKwargs

    return {"cpu": False, "kwargs_handlers": [InitProcessGroupKwargs(backend="gloo")]}


def _torch_optimizer(optimizer) -> torch.optim.Optimizer:
    """The torch optimizer inside accelerate's AcceleratedOptimizer (GPU prepare), or `optimizer` itself."""
    return getattr(optimizer, "optimizer", optimizer)


def _accelerate_shards(accelerator) -> bool:
    """True when accelerate itself applies FSDP2 in prepare (a GPU-family process group)."""
    return bool(getattr(accelerator, "is_fsdp2", False))


def _fully_shard(module: torch.nn.Module, plugin, inference: bool = False) -> torch.nn.Module:
    """FSDP2 as accelerate applies it: each transformer block its own unit, then the whole module.

    The blocks are the plugin's transformer_cls_names_to_wrap (GPT2Block, LlamaDecoderLayer, ...),
    none under NO_WRAP. A block unit reshards after forward as the plugin says; the root keeps its
    parameters until backward (PyTorch's default for the root), or, for an inference-only module
    (`inference`, no backward ever comes), reshards after forward too.
    """
    from torch.distributed.fsdp import fully_shard

    # PolicyWithValueHead returns a view (values.squeeze); drlc never modifies an output in place
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    blocks = set(plugin.transformer_cls_names_to_wrap or ()) if plugin.auto_wrap_policy is not None else set()
    for sub in list(module.modules())[1:]:
        if type(sub).__name__ in blocks:
            fully_shard(sub, reshard_after_forward=plugin.reshard_after_forward)
    return fully_shard(module, reshard_after_forward=True) if inference else fully_shard(module)


def _sharding_summary(model: torch.nn.Module) -> str:
    """How much of `model` this process holds: "k of n parameter tensors sharded, x of y elements here"."""
    params = list(model.parameters())
    sharded = [p for p in params if hasattr(p, "to_local")]  # DTensors
    local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in params)
    return (f"{len(sharded)} of {len(params)} parameter tensors sharded, "
            f"{local} of {sum(p.numel() for p in params)} elements here")


def _repoint(optimizer: torch.optim.Optimizer, names: dict[int, str], sharded: dict) -> None:
    """Point `optimizer`'s parameter groups at the sharded parameters that replaced the plain ones."""
    for group in optimizer.param_groups:
        group["params"] = [sharded[names[id(param)]] for param in group["params"]]
