"""Evaluation decoding (the DExperts protocol): N nucleus samples per prompt, seeded, batched."""
from __future__ import annotations

import torch

from pipeline.parallel.shard import Shard, batch_seed


@torch.no_grad()
def sample_continuations(lm, tokenizer, queries: list[list[int]], *, max_new_tokens: int, top_p: float,
                         seed: int, batch_size: int, shard: Shard | None = None) -> list[list[int]]:
    """One nucleus sample (top_k off) per query, in left-padded batches of `batch_size`.

    Runs on the model's device; torch.manual_seed(batch_seed(seed, b)) seeds batch b (batch 0:
    `seed`), so the same queries, seed, batch size and device give the same samples, and
    `shard` (several processes) decodes only this process's batches and gathers all of them,
    the same list as one process. EOS ends a continuation and is not returned; pad tokens are
    dropped.
    Returns: the continuation token ids of each query, in order.
    """
    lm.eval()
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    device, shard = next(lm.parameters()).device, shard or Shard()
    local = {}
    for index in shard.batches(-(-len(queries) // batch_size)):
        torch.manual_seed(batch_seed(seed, index))
        batch = queries[index * batch_size:(index + 1) * batch_size]
        width = max(len(q) for q in batch)
        ids = torch.tensor([[pad] * (width - len(q)) + q for q in batch], device=device)  # (B, Tq)
        mask = torch.tensor([[0] * (width - len(q)) + [1] * len(q) for q in batch], device=device)  # (B, Tq)
        out = lm.generate(input_ids=ids, attention_mask=mask, do_sample=True, top_p=top_p, top_k=0,
                          max_new_tokens=max_new_tokens, pad_token_id=pad, eos_token_id=eos)[:, width:]
        local[index] = []
        for row in out.tolist():  # (B, <= max_new_tokens)
            if eos in row:
                row = row[: row.index(eos)]
            local[index].append([t for t in row if t != pad])
    return shard.gather(local)
