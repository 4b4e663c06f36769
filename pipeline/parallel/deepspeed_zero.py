"""DeepSpeed ZeRO-1/2/3 for drlc's PPO round: the engine accelerate builds, driven by drlc's loop.

accelerate's prepare builds the engine from the launch config (configs/accelerate/zero*.yaml,
its DeepSpeedPlugin); drlc fills in what its loop owns before that:
- `managed_gradient_accumulation: false`: the engine's backward only accumulates and its step
  is the accumulation boundary (ZeRO-1 reduces there; ZeRO-2/3 reduce-scatter in each backward
  and finish there), so a step whose minibatches the ratio guard skipped needs no extra backward;
- `gradient_accumulation_steps: 1`: drlc divides each loss by ppo.gradient_accumulation_steps;
- `gradient_clipping: ppo.max_grad_norm` (0 = off): ZeRO clips its partitioned gradients in its
  step with the global norm, as torch.nn.utils.clip_grad_norm_ does (coefficient max / (norm + 1e-6));
- `train_micro_batch_size_per_gpu`: each process's share of a minibatch (bookkeeping only).
torch's Adam stays the optimizer: ZeRO steps it over flat fp32 partitions, so its state is
gathered per parameter (deepspeed.utils.safe_get_full_optimizer_state) into the one-process
`optimizer.state_dict()` layout for the checkpoint, and a previous round's state is set back
per parameter after prepare. Offloading, ZeRO-3's zero.Init (zero3_init_flag) and DeepSpeed's
own fp16/bf16 are refused: drlc has not run them (docs/scale-out.md), and its precision is ppo.mixed_precision.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from pipeline.core.errors import ConfigError, DataError
from pipeline.parallel.plain_state import (
    indexed_optimizer_state,
    materialized,
    meta_copy,
    named_optimizer_state,
    parameter_names,
)

MOMENTS = ("exp_avg", "exp_avg_sq")  # torch Adam's per-parameter state besides "step"


@dataclass(frozen=True)
class PlainPolicy:
    """What full_zero_state needs of the policy before prepare: a meta copy and Adam's param_groups (by name)."""

    module: torch.nn.Module
    param_groups: list


def prepare_zero(dp, policy, optimizer, reference, separate: bool, *, max_grad_norm: float | None,
                 micro_batch_size: int):
    """(engine, optimizer, reference) for a DeepSpeed launch; `dp` is the DataParallel.

    The optimizer state loaded before prepare is set aside by parameter name and set into ZeRO's
    partitions after it. ZeRO-3 shards a separate reference in an inference engine (no
    optimizer); ZeRO-1/2 replicate it (they shard no parameters).
    """
    plugin = dp.accelerator.state.deepspeed_plugin
    stage = _configure(plugin, max_grad_norm=max_grad_norm, micro_batch_size=micro_batch_size,
                       world_size=dp.world_size)
    full_state = named_optimizer_state(optimizer.state_dict(), optimizer, parameter_names(policy))
    optimizer.state.clear()
    plain = PlainPolicy(meta_copy(policy), full_state["param_groups"])
    engine, optimizer = dp.accelerator.prepare(policy, optimizer)
    dp.register_plain(engine, plain)
    if full_state["state"]:
        _set_adam_state(engine, full_state["state"])
    if separate and stage == 3:
        reference = _inference_engine(reference, plugin.deepspeed_config)
    elif separate:
        reference = reference.to(dp.device)
    if dp.is_main:
        held = (_partition_summary(reference) if separate and stage == 3 else
                "replicated" if separate else "the policy with adapters off")
        print(f"drlc: DeepSpeed ZeRO-{stage} over {dp.world_size} processes: {_adam_summary(engine)}; "
              f"policy {_partition_summary(engine.module)}; reference {held}", file=sys.stderr)
    return engine, optimizer, reference


def load_models_whole(plugin) -> None:
    """Let transformers load the policy and reference whole under ZeRO-3, as drlc's prepare expects.

    accelerate 1.15 registers the ZeRO-3 config with transformers (HfDeepSpeedConfig) whatever
    zero3_init_flag says, and transformers 5 then builds every from_pretrained model inside
    deepspeed.zero.Init, already partitioned: the reference's deep copy and the checkpoint's meta
    copy of such a model have empty parameters. drlc unregisters it; deepspeed.initialize
    partitions the whole models in prepare.
    Raises ConfigError for zero3_init_flag: true (partitioned loading, which drlc does not do).
    """
    from transformers.integrations import unset_hf_deepspeed_config

    if plugin.zero3_init_flag:
        raise ConfigError("DeepSpeed zero3_init_flag: true is not supported by drlc's PPO loop (it loads the "
                          "policy whole, then prepares it): set zero3_init_flag: false in the accelerate config.")
    unset_hf_deepspeed_config()


def _configure(plugin, *, max_grad_norm: float | None, micro_batch_size: int, world_size: int) -> int:
    """Write drlc's part of the engine config into the plugin's; return the ZeRO stage.

    Raises ConfigError for what drlc has not run under DeepSpeed: offloading, DeepSpeed's fp16/bf16.
    """
    config = plugin.deepspeed_config
    zero = config.setdefault("zero_optimization", {})
    for key in ("offload_optimizer", "offload_param"):
        if (zero.get(key) or {}).get("device", "none") not in (None, "none"):
            raise ConfigError(f"DeepSpeed {key} = {zero[key]['device']!r} is not supported by drlc's PPO loop "
                              f"(untested): set {key}_device: none in the accelerate config.")
    for precision in ("fp16", "bf16"):
        if (config.get(precision) or {}).get("enabled") in (True, "true", "auto"):
            raise ConfigError(f"The DeepSpeed config enables {precision}; drlc's precision is ppo.mixed_precision "
                              f"(its own autocast): remove the {precision} section.")
    config.update(managed_gradient_accumulation=False, gradient_accumulation_steps=1,
                  gradient_clipping=float(max_grad_norm) if max_grad_norm is not None else 0.0,
                  train_micro_batch_size_per_gpu=micro_batch_size, train_batch_size=micro_batch_size * world_size)
    return int(zero.get("stage", 0))


def _flat_partitions(zero_optimizer) -> list[torch.Tensor]:
    """The flat fp32 tensors ZeRO's torch Adam steps: this process's partition of each group."""
    flats = getattr(zero_optimizer, "fp32_partitioned_groups_flat", None)  # ZeRO-3
    return list(flats if flats is not None else zero_optimizer.single_partition_of_fp32_groups)  # ZeRO-1/2


def _set_adam_state(engine, state: dict) -> None:
    """Set a one-process Adam state (keyed by parameter name) into ZeRO's partitions.

    torch's Adam creates its state at the first step; it is created here over the flat
    partitions (one step count for all of them), linked to the parameters as DeepSpeed links it
    after a first step, then filled per parameter.
    Raises DataError when the parameters' step counts differ (ZeRO keeps one per partition).
    """
    from deepspeed.utils import safe_set_full_optimizer_state

    steps = {float(value["step"]) for value in state.values()}
    if len(steps) != 1:
        raise DataError(f"The optimizer state has parameters at different Adam steps {sorted(steps)}; DeepSpeed "
                        "ZeRO keeps one step per partition: resume this round with DDP or FSDP2.")
    zero, (step,) = engine.optimizer, steps
    for flat in _flat_partitions(zero):
        zero.optimizer.state[flat] = {"step": torch.tensor(step), **{key: torch.zeros_like(flat) for key in MOMENTS}}
    link = getattr(zero, "_lazy_init_hp_params_optimizer_state", None)  # ZeRO-1/2 read the state through links
    if link is not None:
        link()
    for name, param in engine.module.named_parameters():
        if name in state:
            for key in MOMENTS:
                value = state[name][key].to(param.device, torch.float32)
                if hasattr(param, "ds_id"):
                    _set_zero3_partition(zero, param, value, key)
                else:
                    safe_set_full_optimizer_state(param, value, key)


def _set_zero3_partition(zero, param, value: torch.Tensor, key: str) -> None:
    """This process's part of `value` (a full Adam moment of `param`) into ZeRO-3's flat state.

    deepspeed 0.19.8's safe_set_full_optimizer_state fails here on a padded partition: a
    1-element bias over 2 processes has a 1-element partition on each, and the last process's
    slice starts past the end ("start (1) + length (1) exceeds dimension size (1)"). The slice is
    cut here with the padding left at 0, as ZeRO-3 pads the parameter itself.
    """
    import torch.distributed as dist

    partition, _ = zero._get_fp32_opt_state_partition(param, release_swap_buffers=False, optim_state_key=key)
    start = partition.numel() * dist.get_rank(param.ds_process_group)
    mine = value.flatten()[start : start + partition.numel()]
    partition.zero_()
    partition[: mine.numel()].copy_(mine)


def full_zero_state(dp, engine) -> tuple[torch.nn.Module | None, dict | None]:
    """DataParallel.full_state under DeepSpeed: (plain policy, one-process Adam state dict) on the main
    process, else (None, None). Every process must call it (ZeRO gathers collectively).

    Weights: each parameter gathered (ZeRO-3) or read (ZeRO-1/2 keep them whole) in turn.
    Adam: each trainable parameter's exp_avg and exp_avg_sq assembled from the partitions, and
    the partitions' common step count.
    """
    from deepspeed.utils import safe_get_full_optimizer_state

    plain = dp.plain_of(engine)
    weights = _gathered_state_dict(engine.module, dp.is_main)
    adam, flats = engine.optimizer.optimizer, _flat_partitions(engine.optimizer)
    state = {}
    if flats and flats[0] in adam.state:  # no step taken (every minibatch skipped): no state, as torch's Adam
        step = adam.state[flats[0]]["step"]
        for name, param in engine.module.named_parameters():
            if param.requires_grad:
                moments = {key: safe_get_full_optimizer_state(param, key).detach().cpu() for key in MOMENTS}
                state[name] = {"step": step.detach().clone().cpu(), **moments}
    if not dp.is_main:
        return None, None
    return (materialized(plain.module, weights),
            indexed_optimizer_state({"state": state, "param_groups": plain.param_groups}))


def _gathered_state_dict(module: torch.nn.Module, is_main: bool) -> dict | None:
    """`module`'s state dict with full CPU tensors on the main process (None elsewhere), gathering one
    ZeRO-3 parameter at a time (GatheredParameters leaves other parameters as they are)."""
    import deepspeed

    params = dict(module.named_parameters(remove_duplicate=False))
    gathered, weights = {}, {}
    for key, value in module.state_dict(keep_vars=True).items():
        if key not in params:
            weights[key] = value.detach().cpu().clone()
            continue
        param = params[key]
        if id(param) not in gathered:
            with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
                gathered[id(param)] = param.detach().to("cpu", copy=True) if is_main else None
        weights[key] = gathered[id(param)]
    return weights if is_main else None


def _inference_engine(reference: torch.nn.Module, policy_config: dict):
    """`reference` in a ZeRO-3 engine without optimizer (its parameters partitioned, gathered per
    module in each forward), with the policy's ZeRO-3 settings."""
    import deepspeed

    zero = {k: v for k, v in policy_config["zero_optimization"].items() if not k.startswith("offload")}
    config = {"train_micro_batch_size_per_gpu": policy_config["train_micro_batch_size_per_gpu"],
              "train_batch_size": policy_config["train_batch_size"], "gradient_accumulation_steps": 1,
              "zero_optimization": zero, "steps_per_print": policy_config.get("steps_per_print", float("inf"))}
    engine, *_ = deepspeed.initialize(model=reference, config=config)
    engine.eval()  # DeepSpeedEngine.eval returns None
    return engine


def _adam_summary(engine) -> str:
    """"Adam state over x of y elements here": this process's share of the trainable elements."""
    here = sum(flat.numel() for flat in _flat_partitions(engine.optimizer))
    total = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel()
                for p in engine.module.parameters() if p.requires_grad)
    return f"Adam state over {here} of {total} elements here"


def _partition_summary(module: torch.nn.Module) -> str:
    """"k of n parameter tensors partitioned, x of y elements here": ZeRO-3 keeps only a partitioned
    parameter's shard (ds_tensor) outside the modules' forwards; a persistent one (at most
    stage3_param_persistence_threshold elements) stays whole once gathered; ZeRO-1/2 partition none."""
    params = list(module.parameters())
    partitioned = {id(p) for p in params if hasattr(p, "ds_tensor") and not p.ds_persist}
    whole = {id(p): p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in params}
    local = sum(p.ds_tensor.numel() if id(p) in partitioned else whole[id(p)] for p in params)
    total = sum(whole.values())
    return f"{len(partitioned)} of {len(params)} parameter tensors partitioned, {local} of {total} elements here"
