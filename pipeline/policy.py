"""The policy: a causal LM with a scalar value head, its frozen reference, and sampling.

Mask convention: `mask` (B, T) float, 1 = response token, 0 = padding.
Every forward pass passes explicit position ids (cumsum of the attention mask − 1), so a
sequence gets the same logits whether it is left padded, right padded or not padded.
All log-probs and values are returned in fp32, also under bf16 autocast. Dropout is off in every pass
here (eval mode).
"""
from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipeline.errors import ConfigError
from pipeline.lora import is_adapter_folder, load_adapter_lm

VALUE_HEAD_FILE = "value_head.safetensors"
# LMs whose forward is trunk -> last hidden state -> output embeddings, with no logit scaling or
# soft-capping (Gemma 2, Cohere and Granite scale their logits and are not listed).
PLAIN_HEAD_MODEL_TYPES = frozenset({"gpt2", "llama", "mistral", "qwen2", "qwen3", "gpt_neox"})


class PolicyWithValueHead(torch.nn.Module):
    """A causal LM (`lm`) and a linear value head (`v_head`) on its last hidden state.

    The value head shares the LM's trunk, as TRL's AutoModelForCausalLMWithValueHead; TRL's
    dropout before the head is omitted because drlc never runs the policy in train mode.
    """

    def __init__(self, lm: torch.nn.Module, v_head: torch.nn.Linear):
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


def load_policy(model_dir: str | Path, *, seed: int = 0):
    """Load a policy and its tokenizer from a local directory.

    A folder with adapter_config.json is a LoRA policy: its base model is loaded with the
    (trainable) adapters applied (pipeline/lora.py).
    The value head comes from `value_head.safetensors` in the directory when present
    (a saved policy), else it is freshly initialised from `seed` (a base model).
    Returns (PolicyWithValueHead in eval mode, tokenizer).
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
    lm = load_adapter_lm(model_dir) if is_adapter_folder(model_dir) else AutoModelForCausalLM.from_pretrained(model_dir)
    head_path = model_dir / VALUE_HEAD_FILE
    v_head = _fresh_value_head(lm.config.hidden_size, seed)
    if head_path.is_file():
        v_head.load_state_dict(load_file(str(head_path)))
    return PolicyWithValueHead(lm, v_head).eval(), tokenizer


def save_policy(policy: PolicyWithValueHead, tokenizer, out_dir: str | Path) -> None:
    """Write the LM and tokenizer (save_pretrained) and the value head to `out_dir`.

    For a LoRA policy the LM part is the adapters only (peft's save_pretrained).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    policy.lm.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    head = {k: v.detach().contiguous() for k, v in policy.v_head.state_dict().items()}
    save_file(head, str(out_dir / VALUE_HEAD_FILE))


def load_reference(model_dir: str | Path) -> PolicyWithValueHead:
    """Load a frozen reference model (eval mode, no gradients) from a local directory.

    It is a PolicyWithValueHead so `batch_forward` serves both models; its values are unused.
    """
    policy, _ = load_policy(model_dir)
    return frozen_copy(policy)


def frozen_copy(policy: PolicyWithValueHead) -> PolicyWithValueHead:
    """A deep copy of `policy` in eval mode with requires_grad False (a reference model)."""
    ref = copy.deepcopy(policy).eval()
    for param in ref.parameters():
        param.requires_grad_(False)
    return ref


def _sample_chunk(policy, queries, *, eos_id, pad_id, max_new_tokens, generator):
    """Sample one left-padded chunk; returns a list of (response_ids, behaviour_logprobs)."""
    width = max(len(q) for q in queries)
    input_ids = torch.tensor([[pad_id] * (width - len(q)) + list(q) for q in queries])  # (B, Q)
    attention = torch.tensor([[0] * (width - len(q)) + [1] * len(q) for q in queries])  # (B, Q)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)  # (B, Q)
    out = policy.lm(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True)
    cache, logits = out.cache, out.logits[:, -1]  # (B, V)
    next_pos = positions[:, -1:] + 1  # (B, 1)
    done = torch.zeros(len(queries), dtype=torch.bool)  # (B,)
    tokens, logprobs = [], []
    for _ in range(max_new_tokens):
        log_p = torch.log_softmax(logits.float(), dim=-1)  # (B, V)
        token = torch.multinomial(log_p.exp(), 1, generator=generator)  # (B, 1)
        token = torch.where(done[:, None], torch.full_like(token, pad_id), token)  # (B, 1)
        tokens.append(token[:, 0])
        logprobs.append(log_p.gather(1, token)[:, 0])
        attention = torch.cat([attention, (~done).long()[:, None]], dim=1)  # (B, Q + t)
        done = done | (token[:, 0] == eos_id)
        if bool(done.all()):
            break
        out = policy.lm(input_ids=token, attention_mask=attention, position_ids=next_pos, cache=cache, use_cache=True)
        cache, logits, next_pos = out.cache, out.logits[:, -1], next_pos + 1
    tokens, logprobs = torch.stack(tokens, 1), torch.stack(logprobs, 1)  # (B, R)
    keep = attention[:, width:].bool()  # (B, R) positions sampled before the row finished
    return [(t[k].tolist(), lp[k].tolist()) for t, lp, k in zip(tokens, logprobs, keep)]


@torch.no_grad()
def sample_responses(
    policy: PolicyWithValueHead,
    *,
    queries: list[list[int]],
    eos_id: int,
    pad_id: int,
    max_new_tokens: int,
    seed: int,
    batch_size: int,
    progress: bool = True,
) -> list[dict]:
    """Sample one response per query from the full distribution (temperature 1, no top-k/p).

    Queries are processed in order in left-padded chunks of `batch_size` with a KV cache;
    one torch.Generator(seed) drives torch.multinomial, so the output is deterministic for a
    seed and batch size. A row stops after EOS (the EOS is kept) or `max_new_tokens` tokens.
    behaviour_logprobs are the fp32 log-probs of the sampled tokens under the distribution
    they were drawn from (dropout off), equal to `batch_forward`'s log-probs up to float error.
    Returns one dict(response_ids: list[int], behaviour_logprobs: list[float]) per query.
    """
    was_training = policy.training
    policy.eval()
    generator = torch.Generator().manual_seed(seed)
    results = []
    starts = range(0, len(queries), batch_size)
    for start in tqdm(starts, desc="sampling", disable=not progress):
        chunk = queries[start : start + batch_size]
        for ids, lps in _sample_chunk(
            policy, chunk, eos_id=eos_id, pad_id=pad_id, max_new_tokens=max_new_tokens, generator=generator
        ):
            results.append({"response_ids": ids, "behaviour_logprobs": lps})
    policy.train(was_training)
    return results


def _at_least_fp32(tensor: torch.Tensor) -> torch.dtype:
    return torch.promote_types(tensor.dtype, torch.float32)  # bf16 -> fp32, fp64 stays fp64


class _TokenLogProbs(torch.autograd.Function):
    """log_softmax(z)[token] with a hand-written backward: d/dz = g · (onehot(token) − softmax(z)).

    Autograd's version zero-fills a (B, T, V) gradient for the gather, scatters into it and runs
    the log-softmax backward over two (B, T, V) tensors; this one computes −g·p from the saved
    softmax and adds g at the token. Same gradient, about half the (B, T, V) passes.
    """

    @staticmethod
    def forward(ctx, logits, tokens, with_entropy: bool):
        log_p = torch.log_softmax(logits, dim=-1, dtype=_at_least_fp32(logits))  # (B, T, V)
        logprobs = log_p.gather(-1, tokens[..., None])  # (B, T, 1)
        probs = log_p.exp()  # (B, T, V)
        entropy = None
        if with_entropy:  # H = −Σ p log p as one batched dot product per position
            flat = probs.shape[-1]
            entropy = -torch.bmm(probs.reshape(-1, 1, flat), log_p.reshape(-1, flat, 1)).reshape(tokens.shape)
        ctx.save_for_backward(probs, tokens)
        ctx.logits_dtype = logits.dtype
        ctx.mark_non_differentiable(*(t for t in (entropy,) if t is not None))
        return logprobs[..., 0], entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_logprobs, _grad_entropy):
        probs, tokens = ctx.saved_tensors
        grad = probs * -grad_logprobs[..., None]  # (B, T, V)
        grad.scatter_add_(-1, tokens[..., None], grad_logprobs[..., None])
        return grad.to(ctx.logits_dtype), None, None


def token_logprobs(*, logits: torch.Tensor, tokens: torch.Tensor, with_entropy: bool = False):
    """Log-prob of `tokens` under softmax(`logits`) and, if asked, the entropy at each position.

    logprobs = log_softmax(logits)[token] (differentiable); entropy = −Σ_v p_v log p_v (no grad).
    logits (B, T, V) fp32 or bf16 (upcast to fp32 inside the log-softmax), tokens (B, T) long.
    Returns (logprobs (B, T), entropy (B, T) or None), in fp32 (fp64 for fp64 logits).
    """
    if torch.is_grad_enabled() and logits.requires_grad:
        return _TokenLogProbs.apply(logits, tokens, with_entropy)
    return _no_grad_token_logprobs(logits, tokens, with_entropy)


def _no_grad_token_logprobs(logits, tokens, with_entropy):
    log_p = torch.log_softmax(logits, dim=-1, dtype=_at_least_fp32(logits))  # (B, T, V)
    logprobs = log_p.gather(-1, tokens[..., None])[..., 0]  # (B, T)
    entropy = -(log_p.exp() * log_p).sum(-1) if with_entropy else None  # (B, T)
    return logprobs, entropy


def autocast_context(mixed_precision: str, device: torch.device):
    """bf16 autocast on `device` when mixed_precision == "bf16", else a no-op context.

    Raises ConfigError for any other value than "fp32" or "bf16".
    """
    if mixed_precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    if mixed_precision == "fp32":
        return contextlib.nullcontext()
    raise ConfigError(f"mixed_precision {mixed_precision!r} is not supported: use 'fp32' or 'bf16'.")


@dataclass(frozen=True)
class ResponseScores:
    """What one forward pass says about each response token; every tensor is fp32."""

    logprobs: torch.Tensor  # (B, T) log-prob of the response token, 0 on padding
    values: torch.Tensor  # (B, T) value of the state before the token, 0 on padding
    mask: torch.Tensor  # (B, T) 1 = response token
    logits: torch.Tensor | None  # (B, T, V) logits that predicted the token, when keep_logits
    entropy: torch.Tensor | None  # (B, T) entropy of that distribution (no grad), when with_entropy


def score_responses(
    policy: PolicyWithValueHead,
    *,
    query_ids: list[list[int]],
    response_ids: list[list[int]],
    pad_id: int,
    width: int | None = None,
    mixed_precision: str = "fp32",
    keep_logits: bool = False,
    with_entropy: bool = False,
) -> ResponseScores:
    """Score responses given their queries in one right-padded forward pass.

    Builds input = query + response per row. For response token j of row b (at input
    position p = len(query_b) + j) it uses the logits at p − 1 and the value at p − 1 (the
    state before the token), as TRL aligned them; the LM head runs on those positions only.
    The model runs under bf16 autocast when mixed_precision == "bf16"; the log-softmax,
    log-probs, values and entropy are computed from fp32 logits outside autocast.
    width: number of response positions T (default: the longest response).
    Gradients flow through logprobs and values unless the caller disables them.
    Returns a ResponseScores on the model's device.
    """
    device = next(policy.parameters()).device
    width = width or max(len(r) for r in response_ids)
    rows = [list(q) + list(r) for q, r in zip(query_ids, response_ids)]
    length = max(len(row) for row in rows)
    input_ids = torch.tensor([row + [pad_id] * (length - len(row)) for row in rows], device=device)  # (B, L)
    attention = torch.tensor([[1] * len(row) + [0] * (length - len(row)) for row in rows], device=device)  # (B, L)
    steps = torch.arange(width, device=device)  # (T,)
    q_len = torch.tensor([len(q) for q in query_ids], device=device)  # (B,)
    r_len = torch.tensor([len(r) for r in response_ids], device=device)  # (B,)
    mask = (steps[None, :] < r_len[:, None]).float()  # (B, T)
    before = (q_len[:, None] - 1 + steps[None, :]).clamp(max=length - 1)  # (B, T) state before token j
    tokens = input_ids.gather(1, (before + 1).clamp(max=length - 1))  # (B, T)
    with autocast_context(mixed_precision, device):
        logits, values = policy(input_ids=input_ids, attention_mask=attention, positions=before)  # (B,T,V), (B,T)
    logprobs, entropy = token_logprobs(logits=logits, tokens=tokens, with_entropy=with_entropy)  # (B, T) each
    return ResponseScores(logprobs * mask, values * mask, mask, logits if keep_logits else None, entropy)


def batch_forward(
    policy: PolicyWithValueHead,
    *,
    query_ids: list[list[int]],
    response_ids: list[list[int]],
    pad_id: int,
    width: int | None = None,
):
    """score_responses in fp32, returned as (logprobs (B, T), values (B, T), mask (B, T), logits (B, T, V))."""
    scores = score_responses(policy, query_ids=query_ids, response_ids=response_ids, pad_id=pad_id, width=width,
                             keep_logits=True)
    return scores.logprobs, scores.values, scores.mask, scores.logits
