"""The reference model of the KL penalty, in the three forms the paper's runs used.

1. A frozen copy of the base model (the default).
2. Shared lower layers (`ppo.num_shared_layers: N`, TRL's create_reference_model): the policy's
   parameters that come before transformer block N (embeddings and blocks 0..N-1, and so an
   output layer tied to the embeddings) are frozen, and the reference uses the very same tensors
   for them, so they are stored once. Everything above block N is a frozen copy of the base.
3. A LoRA policy (peft): the reference is the policy itself run with its adapters disabled, so
   no second model is held at all.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from pipeline.core.errors import ConfigError
from pipeline.model.lora import has_adapters
from pipeline.model.policy import PolicyWithValueHead, load_reference

# "transformer.h.3.attn..." (GPT-2), "model.layers.3.mlp..." (Llama, Mistral, Qwen), "gpt_neox.layers.3..."
_BLOCK = re.compile(r"(?:^|\.)(?:h|layers|blocks)\.(\d+)\.")


class AdaptersDisabled(torch.nn.Module):
    """The reference of a LoRA policy: the same modules, run with every adapter switched off."""

    def __init__(self, policy: PolicyWithValueHead):
        super().__init__()
        self.policy = policy

    @property
    def plain_head(self) -> bool:
        return self.policy.plain_head

    def forward(self, **inputs):
        with torch.no_grad(), self.policy.lm.disable_adapter():
            return self.policy(**inputs)


def shared_parameter_names(lm: torch.nn.Module, num_shared_layers: int) -> list[str]:
    """Names of lm's parameters (in registration order) that come before transformer block N.

    Raises ConfigError if the model has no block N (it must keep at least one block trainable).
    """
    names = [name for name, _ in lm.named_parameters()]
    first_of_block = next((i for i, name in enumerate(names)
                           if (m := _BLOCK.search(name)) and int(m.group(1)) == num_shared_layers), None)
    if first_of_block is None:
        blocks = {int(m.group(1)) for name in names if (m := _BLOCK.search(name))}
        raise ConfigError(f"'ppo.num_shared_layers' = {num_shared_layers} leaves no transformer block to train: "
                          f"the model has {len(blocks)} blocks; use a value below {len(blocks)} or null.")
    return names[:first_of_block]


def share_lower_layers(policy: PolicyWithValueHead, reference: PolicyWithValueHead, num_shared_layers: int) -> int:
    """Freeze the policy's lower layers and make the reference use the same tensors; return their count.

    Raises ConfigError if the policy's lower layers differ from the reference's (then they were
    trained in an earlier round, i.e. num_shared_layers changed in the middle of a run).
    """
    policy_params = dict(policy.lm.named_parameters())
    shared = {id(policy_params[name]): policy_params[name]
              for name in shared_parameter_names(policy.lm, num_shared_layers)}
    reference_params = dict(reference.lm.named_parameters(remove_duplicate=False))
    for name, param in policy.lm.named_parameters(remove_duplicate=False):
        if id(param) not in shared:
            continue
        if not torch.equal(param, reference_params[name]):
            raise ConfigError(f"'ppo.num_shared_layers' = {num_shared_layers}: the policy's '{name}' differs from "
                              "the reference's, so it was trained in an earlier round; keep num_shared_layers "
                              "the same for every round of a run.")
        param.requires_grad_(False)
        module_name, _, leaf = name.rpartition(".")
        setattr(reference.lm.get_submodule(module_name), leaf, param)
    return len(shared)


def make_reference(policy: PolicyWithValueHead, reference_dir: str | Path,
                   num_shared_layers: int | None = None) -> torch.nn.Module:
    """The reference for `policy` (see the module docstring); call before building the optimizer.

    Raises ConfigError for num_shared_layers with a LoRA policy (LoRA already freezes the base).
    """
    if has_adapters(policy.lm):
        if num_shared_layers is not None:
            raise ConfigError("'ppo.num_shared_layers' and 'base.lora_r' > 0 exclude each other: LoRA already "
                              "freezes every base weight; set num_shared_layers to null.")
        return AdaptersDisabled(policy)
    reference = load_reference(reference_dir)
    if num_shared_layers is not None:
        share_lower_layers(policy, reference, num_shared_layers)
    return reference

