"""Log-probs of given responses: per-token log-probs, values and entropy in one forward pass.

Mask convention: `mask` (B, T) float, 1 = response token, 0 = padding.
All log-probs and values are returned in fp32, also under bf16 autocast. The log-prob of a
token has a hand-written backward (`token_logprobs`) that saves (B, T, V) passes.
"""
from __future__ import annotations

import contextlib
import functools
import warnings
from dataclasses import dataclass

import torch

from pipeline.core.errors import ConfigError
from pipeline.model.policy import PolicyWithValueHead


def _at_least_fp32(tensor: torch.Tensor) -> torch.dtype:
    return torch.promote_types(tensor.dtype, torch.float32)  # bf16 -> fp32, fp64 stays fp64


def _softmax_terms(logits, tokens, with_entropy: bool):
    """(probs (B, T, V), logprobs (B, T), entropy (B, T) or None) from one softmax pass, in fp32 or wider.

    One pass over the vocabulary where log_softmax-then-exp takes two: the log-normalizer
    log Σ_v exp z_v comes from the softmax itself, because its largest probability is exactly
    1 / Σ_v exp(z_v − max z), so log Σ_v exp z_v = max z − log max p. Then
    log p_token = z_token − log Σ_v exp z_v (no underflow for unlikely tokens) and
    H = −Σ_v p_v log p_v = log Σ_v exp z_v − Σ_v p_v z_v (one batched dot product per position).
    """
    dtype = _at_least_fp32(logits)
    probs = torch.softmax(logits, dim=-1, dtype=dtype)  # (B, T, V)
    log_normalizer = logits.amax(-1).to(dtype) - probs.amax(-1).log()  # (B, T)
    logprobs = logits.gather(-1, tokens[..., None])[..., 0].to(dtype) - log_normalizer  # (B, T)
    entropy = None
    if with_entropy:
        vocab = probs.shape[-1]
        expected_logit = torch.bmm(probs.reshape(-1, 1, vocab), logits.to(dtype).reshape(-1, vocab, 1))
        entropy = log_normalizer - expected_logit.reshape(tokens.shape)  # (B, T)
    return probs, logprobs, entropy


class _TokenLogProbs(torch.autograd.Function):
    """log_softmax(z)[token] with a hand-written backward: d/dz = g · (onehot(token) − softmax(z)).

    Autograd's version zero-fills a (B, T, V) gradient for the gather, scatters into it and runs
    the log-softmax backward over two (B, T, V) tensors; this one computes −g·p from the saved
    softmax and adds g at the token. Same gradient, about half the (B, T, V) passes.
    """

    @staticmethod
    def forward(ctx, logits, tokens, with_entropy: bool):
        probs, logprobs, entropy = _softmax_terms(logits, tokens, with_entropy)
        ctx.save_for_backward(probs, tokens)
        ctx.logits_dtype = logits.dtype
        ctx.mark_non_differentiable(*(t for t in (entropy,) if t is not None))
        return logprobs, entropy

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
    logits (B, T, V) fp32 or bf16 (upcast to fp32 inside the softmax), tokens (B, T) long.
    Returns (logprobs (B, T), entropy (B, T) or None), in fp32 (fp64 for fp64 logits).
    """
    if torch.is_grad_enabled() and logits.requires_grad:
        return _TokenLogProbs.apply(logits, tokens, with_entropy)
    if with_entropy:
        return _softmax_terms(logits, tokens, with_entropy)[1:]
    log_p = torch.log_softmax(logits, dim=-1, dtype=_at_least_fp32(logits))  # (B, T, V): one pass, no probs needed
    return log_p.gather(-1, tokens[..., None])[..., 0], None


def cpu_has_native_bf16() -> bool:
    """True when this CPU computes bf16 natively (AVX512-BF16 or AMX); without either, bf16 is emulated."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


@functools.cache
def _warn_slow_cpu_bf16() -> None:
    # Measured on an AVX2-only EPYC: one 12x768 bf16 update took over 12 CPU-minutes, 14 s in fp32.
    warnings.warn("mixed_precision bf16 on a CPU without native bf16 (no AVX512-BF16 or AMX) is emulated and "
                  "many times slower than fp32: set ppo.mixed_precision: fp32 on this machine.", stacklevel=3)


def autocast_context(mixed_precision: str, device: torch.device):
    """bf16 autocast on `device` when mixed_precision == "bf16", else a no-op context.

    Raises ConfigError for any other value than "fp32" or "bf16".
    """
    if mixed_precision == "bf16":
        if device.type == "cpu" and not cpu_has_native_bf16():
            _warn_slow_cpu_bf16()
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    if mixed_precision == "fp32":
        return contextlib.nullcontext()
    raise ConfigError(f"mixed_precision {mixed_precision!r} is not supported: use 'fp32' or 'bf16'.")


@dataclass(frozen=True)
class ResponseLogprobs:
    """What one forward pass says about each response token (its log-prob and more); every tensor is fp32."""

    logprobs: torch.Tensor  # (B, T) log-prob of the response token, 0 on padding
    values: torch.Tensor  # (B, T) value of the state before the token, 0 on padding
    mask: torch.Tensor  # (B, T) 1 = response token
    logits: torch.Tensor | None  # (B, T, V) logits that predicted the token, when keep_logits
    entropy: torch.Tensor | None  # (B, T) entropy of that distribution (no grad), when with_entropy


def response_logprobs(
    policy: PolicyWithValueHead,
    *,
    query_ids: list[list[int]],
    response_ids: list[list[int]],
    pad_id: int,
    width: int | None = None,
    mixed_precision: str = "fp32",
    keep_logits: bool = False,
    with_entropy: bool = False,
) -> ResponseLogprobs:
    """Log-probs (and values, logits, entropy) of responses given their queries, in one right-padded forward pass.

    Builds input = query + response per row. For response token j of row b (at input
    position p = len(query_b) + j) it uses the logits at p − 1 and the value at p − 1 (the
    state before the token), as TRL aligned them; the LM head runs on those positions only.
    The model runs under bf16 autocast when mixed_precision == "bf16"; the softmax,
    log-probs, values and entropy are computed from fp32 logits outside autocast.
    width: number of response positions T (default: the longest response).
    Gradients flow through logprobs and values unless the caller disables them.
    Returns a ResponseLogprobs on the model's device.
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
    return ResponseLogprobs(logprobs * mask, values * mask, mask, logits if keep_logits else None, entropy)
