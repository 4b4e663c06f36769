"""The policy model: a causal LM with a scalar value head, its frozen reference, and checkpoints.

Sampling lives in pipeline/model/sampling.py, log-probs and values of given responses in
pipeline/model/logprobs.py. Every forward pass passes explicit position ids (cumsum of the attention
mask − 1), so a sequence gets the same logits whether it is left padded, right padded or not
padded. Values are returned in fp32, also under bf16 autocast.
"""
from __future__ import annotations

import copy
import math
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipeline.core.atomic import atomic_folder
from pipeline.core.errors import ConfigError
from pipeline.model.lora import is_adapter_folder, load_adapter_lm

VALUE_HEAD_FILE = "value_head.safetensors"
# LMs whose forward is trunk -> last hidden state -> output embeddings, with no logit scaling or
# soft-capping (Gemma 2, Cohere and Granite scale their logits and are not listed).
PLAIN_HEAD_MODEL_TYPES = frozenset({"gpt2", "llama", "mistral", "qwen2", "qwen3", "gpt_neox"})


class PolicyWithValueHead(torch.nn.Module):
    """A causal LM (`lm`) and a linear value head (`v_head`) on its last hidden state.

    The value head shares the LM's trunk, as TRL's AutoModelForCausalLMWithValueHead; TRL's
    dropout before the head is omitted because drlc never runs the policy in train mode.
    v_head None: a value-free policy (ppo.algorithm grpo, rloo, reinforce_pp) with no head at all;
    its values are zeros, no parameter.
    """

    def __init__(self, lm: torch.nn.Module, v_head: torch.nn.Linear | None):
        super().__init__()
        self.lm = lm
        self.v_head = v_head

    def forward(self, *, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor | None = None):
        """Return (logits fp32, values fp32) for a padded batch (B, L).

        positions: optional (B, T) input positions; then logits (B, T, V) and values (B, T) are
        returned only there. For LMs whose logits are exactly output_embeddings(last hidden
        state) (PLAIN_HEAD_MODEL_TYPES) the LM head then runs on those T positions only: the
        (B, L, V) logits are never built, which saves most of the head's time and memory.
        Without positions: logits (B, L, V), values (B, L).
        The value head always runs in fp32, even under bf16 autocast.
        """
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, L)
        inputs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
        if positions is not None and self.plain_head:
            hidden = self.trunk(**inputs).last_hidden_state  # (B, L, H)
            hidden = hidden.gather(1, positions[..., None].expand(-1, -1, hidden.shape[-1]))  # (B, T, H)
            logits = self.lm.get_output_embeddings()(hidden)  # (B, T, V)
        else:
            out = self.lm(**inputs, output_hidden_states=True)
            hidden, logits = out.hidden_states[-1], out.logits  # (B, L, H), (B, L, V)
            if positions is not None:
                hidden = hidden.gather(1, positions[..., None].expand(-1, -1, hidden.shape[-1]))  # (B, T, H)
                logits = logits.gather(1, positions[..., None].expand(-1, -1, logits.shape[-1]))  # (B, T, V)
        if self.v_head is None:
            return logits.float(), torch.zeros(hidden.shape[:2], device=hidden.device)  # no value head
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            values = self.v_head(hidden.float()).squeeze(-1)  # (B, T) or (B, L)
        return logits.float(), values

    @property
    def trunk(self) -> torch.nn.Module:
        """The transformer below the LM head (inside the peft wrapper for a LoRA policy)."""
        causal_lm = self.lm.get_base_model() if hasattr(self.lm, "get_base_model") else self.lm
        return causal_lm.base_model

    @property
    def plain_head(self) -> bool:
        """True when logits = output_embeddings(last hidden state), so the head can run on a subset."""
        return getattr(self.lm.config, "model_type", None) in PLAIN_HEAD_MODEL_TYPES


def _fresh_value_head(hidden_size: int, seed: int) -> torch.nn.Linear:
    """A Linear(hidden, 1) with PyTorch's default uniform init, drawn from a seeded generator."""
    head = torch.nn.Linear(hidden_size, 1)
    bound = 1.0 / math.sqrt(hidden_size)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head.weight.uniform_(-bound, bound, generator=generator)
        head.bias.uniform_(-bound, bound, generator=generator)
    return head


def load_policy(model_dir: str | Path, *, seed: int = 0, value_head: bool = True):
    """Load a policy and its tokenizer from a local directory.

    value_head False: no head is built or read (a value-free algorithm; a head file in the folder is ignored).
    A folder with adapter_config.json is a LoRA policy: its base model is loaded with the
    (trainable) adapters applied (pipeline/model/lora.py).
    The value head comes from `value_head.safetensors` in the directory when present
    (a saved policy), else it is freshly initialised from `seed` (a base model).
    Returns (PolicyWithValueHead in eval mode, tokenizer).
    Raises ConfigError if the directory is missing or the tokenizer has no pad token.
    """
    model_dir = Path(model_dir)
    tokenizer = load_tokenizer(model_dir)
    lm = load_adapter_lm(model_dir) if is_adapter_folder(model_dir) else AutoModelForCausalLM.from_pretrained(model_dir)
    if not value_head:
        return PolicyWithValueHead(lm, None).eval(), tokenizer
    head_path = model_dir / VALUE_HEAD_FILE
    v_head = _fresh_value_head(lm.config.hidden_size, seed)
    if head_path.is_file():
        v_head.load_state_dict(load_file(str(head_path)))
    return PolicyWithValueHead(lm, v_head).eval(), tokenizer


def load_tokenizer(model_dir: str | Path):
    """The tokenizer of a policy folder (what a rollout engine other than drlc's own needs of it).

    Raises ConfigError if the directory is missing or the tokenizer has no pad token.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ConfigError(f"Model directory '{model_dir}' does not exist: run the base stage first.")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token_id is None:
        raise ConfigError(
            f"Tokenizer in '{model_dir}' has no pad token: set one (e.g. tokenizer.pad_token = "
            "tokenizer.eos_token) and save it again."
        )
    return tokenizer


def save_policy(policy: PolicyWithValueHead, tokenizer, out_dir: str | Path) -> None:
    """Write the policy checkpoint to `out_dir` atomically (pipeline/core/atomic.py).

    `out_dir` is then either absent, its old content, or the complete checkpoint; an existing
    folder is replaced, not merged into.
    """
    with atomic_folder(out_dir) as folder:
        write_policy_files(policy, tokenizer, folder)


def write_policy_files(policy: PolicyWithValueHead, tokenizer, folder: str | Path) -> None:
    """Write the LM and tokenizer (save_pretrained) and the value head, if it has one, into `folder` (not atomic).

    For a LoRA policy the LM part is the adapters only (peft's save_pretrained).
    `policy` must be the plain module (unwrapped from DDP/FSDP, state gathered).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    policy.lm.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if policy.v_head is None:
        return
    head = {k: v.detach().contiguous() for k, v in policy.v_head.state_dict().items()}
    save_file(head, str(folder / VALUE_HEAD_FILE))


def load_reference(model_dir: str | Path) -> PolicyWithValueHead:
    """Load a frozen reference model (eval mode, no gradients) from a local directory.

    It is a PolicyWithValueHead so `pipeline.model.logprobs.response_logprobs` serves both models; its
    values are unused.
    """
    policy, _ = load_policy(model_dir)
    return frozen_copy(policy)


def frozen_copy(policy: PolicyWithValueHead) -> PolicyWithValueHead:
    """A deep copy of `policy` in eval mode with requires_grad False (a reference model)."""
    ref = copy.deepcopy(policy).eval()
    for param in ref.parameters():
        param.requires_grad_(False)
    return ref
