"""The policy: a causal LM with a scalar value head, its frozen reference, and sampling.

Mask convention: `mask` (B, T) float, 1 = response token, 0 = padding.
Every forward pass passes explicit position ids (cumsum of the attention mask − 1), so a
sequence gets the same logits whether it is left padded, right padded or not padded.
All log-probs and values are returned in fp32. Dropout is off in every pass here (eval mode).
"""
from __future__ import annotations

import copy
import math
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipeline.errors import ConfigError

VALUE_HEAD_FILE = "value_head.safetensors"


class PolicyWithValueHead(torch.nn.Module):
    """A causal LM (`lm`) and a linear value head (`v_head`) on its last hidden state.

    The value head shares the LM's trunk, as TRL's AutoModelForCausalLMWithValueHead; TRL's
    dropout before the head is omitted because drlc never runs the policy in train mode.
    """

    def __init__(self, lm: torch.nn.Module, v_head: torch.nn.Linear):
        super().__init__()
        self.lm = lm
        self.v_head = v_head

    def forward(self, *, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        """Return (logits (B, T, V) fp32, values (B, T) fp32) for a padded batch."""
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, T)
        out = self.lm(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            output_hidden_states=True,
        )
        hidden = out.hidden_states[-1]  # (B, T, H)
        values = self.v_head(hidden.to(self.v_head.weight.dtype)).squeeze(-1).float()  # (B, T)
        return out.logits.float(), values


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
    lm = AutoModelForCausalLM.from_pretrained(model_dir)
    head_path = model_dir / VALUE_HEAD_FILE
    v_head = _fresh_value_head(lm.config.hidden_size, seed)
    if head_path.is_file():
        v_head.load_state_dict(load_file(str(head_path)))
    return PolicyWithValueHead(lm, v_head).eval(), tokenizer


def save_policy(policy: PolicyWithValueHead, tokenizer, out_dir: str | Path) -> None:
    """Write the LM and tokenizer (save_pretrained) and the value head to `out_dir`."""
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


def batch_forward(
    policy: PolicyWithValueHead,
    *,
    query_ids: list[list[int]],
    response_ids: list[list[int]],
    pad_id: int,
    width: int | None = None,
):
    """Score responses given their queries in one right-padded forward pass.

    Builds input = query + response per row. For response token j of row b (at input
    position p = len(query_b) + j) it returns the log-prob of that token from the logits at
    p − 1 and the value at p − 1 (the state before the token), as TRL aligned them.
    width: number of response positions T (default: the longest response).
    Returns (logprobs (B, T), values (B, T), mask (B, T), logits (B, T, V)), all fp32;
    gradients flow unless the caller disables them.
    """
    width = width or max(len(r) for r in response_ids)
    rows = [list(q) + list(r) for q, r in zip(query_ids, response_ids)]
    length = max(len(row) for row in rows)
    input_ids = torch.tensor([row + [pad_id] * (length - len(row)) for row in rows])  # (B, L)
    attention = torch.tensor([[1] * len(row) + [0] * (length - len(row)) for row in rows])  # (B, L)
    logits, values = policy(input_ids=input_ids, attention_mask=attention)  # (B, L, V), (B, L)
    steps = torch.arange(width)  # (T,)
    q_len = torch.tensor([len(q) for q in query_ids])  # (B,)
    r_len = torch.tensor([len(r) for r in response_ids])  # (B,)
    mask = (steps[None, :] < r_len[:, None]).float()  # (B, T)
    before = (q_len[:, None] - 1 + steps[None, :]).clamp(max=length - 1)  # (B, T) state before token j
    target = (before + 1).clamp(max=length - 1)  # (B, T)
    resp_logits = logits.gather(1, before[..., None].expand(-1, -1, logits.shape[-1]))  # (B, T, V)
    tokens = input_ids.gather(1, target)  # (B, T)
    logprobs = torch.log_softmax(resp_logits, dim=-1).gather(2, tokens[..., None])[..., 0]  # (B, T)
    resp_values = values.gather(1, before)  # (B, T)
    return logprobs * mask, resp_values * mask, mask, resp_logits
