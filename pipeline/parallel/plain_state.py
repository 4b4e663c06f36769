"""The one-process layout of a sharded policy's checkpoint, shared by FSDP2 (distributed.py) and
DeepSpeed ZeRO (deepspeed_zero.py).

Before prepare, each keeps a meta-device copy of the plain policy (`meta_copy`) and sets the
previous round's optimizer state aside keyed by parameter name (`named_optimizer_state`); after
training it loads the gathered full weights into that copy (`materialized`) and turns the gathered
name-keyed optimizer state back into `optimizer.state_dict()`'s numbered layout
(`indexed_optimizer_state`), so the checkpoint is the one a single process writes.
"""
from __future__ import annotations

import copy

import torch


def parameter_names(module: torch.nn.Module) -> dict[int, str]:
    """id(parameter) -> its name in `module` (a tied parameter: its first name)."""
    return {id(param): name for name, param in module.named_parameters()}


def named_optimizer_state(state_dict: dict, optimizer: torch.optim.Optimizer, names: dict[int, str]) -> dict:
    """`optimizer.state_dict()` (parameters numbered in group order) keyed by parameter name instead,
    the layout torch.distributed.checkpoint's full optimizer state dict has."""
    order = [names[id(param)] for group in optimizer.param_groups for param in group["params"]]
    return {"state": {order[i]: value for i, value in state_dict["state"].items()},
            "param_groups": [{**group, "params": [order[i] for i in group["params"]]}
                             for group in state_dict["param_groups"]]}


def indexed_optimizer_state(state_dict: dict) -> dict:
    """The inverse of named_optimizer_state: a name-keyed full state dict as `optimizer.state_dict()` lays it out."""
    order = [name for group in state_dict["param_groups"] for name in group["params"]]
    index = {name: i for i, name in enumerate(order)}
    return {"state": {index[name]: value for name, value in state_dict["state"].items()},
            "param_groups": [{**group, "params": [index[name] for name in group["params"]]}
                             for group in state_dict["param_groups"]]}


def meta_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of `module` whose parameters are on the meta device (no memory): the plain module
    that a gathered full state dict is loaded into for the checkpoint."""
    memo = {id(param): torch.nn.Parameter(torch.empty_like(param, device="meta"), param.requires_grad)
            for param in module.parameters()}
    return copy.deepcopy(module, memo)


def materialized(meta_module: torch.nn.Module, state_dict: dict) -> torch.nn.Module:
    """`meta_module` on CPU holding `state_dict`, with its tied parameters (an LM head tied to the
    embeddings) one tensor again: to_empty gives each name its own tensor, and save_pretrained
    would then write the head twice."""
    names = {}
    for name, param in meta_module.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    module = meta_module.to_empty(device="cpu")
    for first, *others in names.values():
        for other in others:
            owner, _, leaf = other.rpartition(".")
            setattr(module.get_submodule(owner), leaf, module.get_parameter(first))
    module.load_state_dict(state_dict)
    return module
