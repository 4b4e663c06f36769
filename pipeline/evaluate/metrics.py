"""Evaluation metrics, each a small function of plain values.

- distinct_n: DExperts-style diversity. For each prompt, the number of unique n-grams over the
  number of n-grams across its samples (whitespace tokens); the mean over prompts.
- positive_share: share of continuations whose sentiment score is >= a threshold.
- perplexity: conditional perplexity of each continuation given its query under a language
  model, exp(mean token NLL); the mean over samples.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def distinct_n(samples_by_prompt: list[list[str]], n: int) -> float:
    """Mean over prompts of unique/total n-grams of that prompt's samples (0 if a prompt has none)."""
    ratios = []
    for samples in samples_by_prompt:
        ngrams = [tuple(words[i:i + n]) for text in samples
                  for words in [text.split()] for i in range(len(words) - n + 1)]
        ratios.append(len(set(ngrams)) / len(ngrams) if ngrams else 0.0)
    return sum(ratios) / len(ratios) if ratios else 0.0


def positive_share(scores: list[float], threshold: float = 0.05) -> float:
    """Fraction of scores >= threshold (VADER's conventional 'positive' cut is compound >= 0.05)."""
    return sum(s >= threshold for s in scores) / len(scores) if scores else 0.0


@torch.no_grad()
def conditional_perplexities(lm, *, query_ids: list[list[int]], response_ids: list[list[int]]) -> list[float]:
    """exp(mean NLL of the response tokens given the query) for each (query, response) pair.

    Pairs with an empty response get NaN (no tokens to score). One pair per forward pass keeps
    the code free of padding; evaluation sets are small.
    """
    lm.eval()
    out = []
    for query, response in zip(query_ids, response_ids):
        if not response:
            out.append(math.nan)
            continue
        ids = torch.tensor([query + response])  # (1, Tq+Tr)
        logits = lm(input_ids=ids).logits[0, :-1].float()  # (Tq+Tr-1, V)
        targets = ids[0, 1:]  # (Tq+Tr-1,)
        nll = F.cross_entropy(logits, targets, reduction="none")[len(query) - 1:]  # (Tr,)
        out.append(math.exp(nll.mean().item()))
    return out
