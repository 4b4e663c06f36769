"""Evaluation metrics, each a small function of plain values.

- distinct_n: DExperts' diversity. For each prompt, the number of distinct n-grams over the
  number of words across all its samples (words = whitespace tokens; DExperts splits on
  single spaces, which also counts empty strings as words; we do not). The mean over prompts
  that have at least one word.
- positive_percent: percentage of continuations a classifier calls positive (P >= threshold).
- conditional_perplexities: perplexity of each continuation given its query under a language
  model, exp(mean token NLL); the reported fluency is the mean over samples (as in DExperts).
- response_logprobs / kl_to_reference: log pi(y|x) summed over each continuation's tokens, and the
  mean over samples y ~ pi of log pi(y|x) - log pi_ref(y|x): the k1 (Monte Carlo) estimate of
  KL(pi || pi_ref) per response, in nats, as the trainer's `kl` sums it over a response's tokens.
- win_rate / pairwise_win_rate: the share of comparisons a summary's reward-model score wins
  (1 if higher, 1/2 if equal within TIE_TOLERANCE = 1e-6, 0 if lower): against its prompt's
  reference, or against another run's samples of the same prompt.

Only conditional_perplexities and response_logprobs run a model, so only they import torch: `drlc report` reads the
win rates without it.
"""
from __future__ import annotations

import math

from pipeline.parallel.shard import Shard


def distinct_n(samples_by_prompt: list[list[str]], n: int) -> float:
    """Mean over prompts of (distinct n-grams) / (words) in that prompt's samples.

    Prompts whose samples hold no word are left out; 0.0 if every prompt is.
    """
    ratios = []
    for samples in samples_by_prompt:
        grams, n_words = set(), 0
        for text in samples:
            words = text.split()
            n_words += len(words)
            grams.update(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
        if n_words:
            ratios.append(len(grams) / n_words)
    return sum(ratios) / len(ratios) if ratios else 0.0


def positive_share(scores: list[float], threshold: float = 0.05) -> float:
    """Fraction of scores >= threshold (VADER's conventional 'positive' cut is compound >= 0.05)."""
    return sum(s >= threshold for s in scores) / len(scores) if scores else 0.0


def positive_percent(probabilities: list[float], threshold: float = 0.5) -> float:
    """Percentage (0-100) of P(positive) values >= threshold."""
    return 100.0 * positive_share(probabilities, threshold)


def nanmean(values: list[float]) -> float:
    """Mean of the values that are not NaN (NaN if there are none)."""
    kept = [v for v in values if v == v]
    return sum(kept) / len(kept) if kept else math.nan


TIE_TOLERANCE = 1e-6  # scores this close tie: batching/padding moves fp32 RM scores by ~1e-7


def _wins(score: float, opponent: float) -> float:
    """1 if score beats opponent by more than TIE_TOLERANCE, 0 if it loses by more, else 0.5 (a tie)."""
    return 1.0 if score > opponent + TIE_TOLERANCE else 0.0 if score < opponent - TIE_TOLERANCE else 0.5


def win_rate(scores: list[float], opponents: list[float]) -> float:
    """Mean over i of wins(scores[i], opponents[i]); ties count half. NaN for empty lists."""
    assert len(scores) == len(opponents)
    return sum(map(_wins, scores, opponents)) / len(scores) if scores else math.nan


def pairwise_win_rate(scores_by_prompt: list[list[float]], opponents_by_prompt: list[list[float]]) -> float:
    """Mean over prompts of the share of (sample, opponent sample) pairs of that prompt won, ties half.

    Every sample of a prompt meets every opponent sample of the same prompt (k_a x k_b pairs), so
    samples are not paired by their index. Prompts where either side has no sample are left out;
    NaN if none is left.
    """
    rates = [sum(_wins(a, b) for a in mine for b in theirs) / (len(mine) * len(theirs))
             for mine, theirs in zip(scores_by_prompt, opponents_by_prompt, strict=True) if mine and theirs]
    return sum(rates) / len(rates) if rates else math.nan


def conditional_perplexities(lm, *, query_ids: list[list[int]], response_ids: list[list[int]],
                             batch_size: int = 64, shard: Shard | None = None) -> list[float]:
    """exp(mean NLL of the response tokens given the query) for each (query, response) pair.

    Pairs with an empty response get NaN (no tokens to score); batching as :func:`_per_response`.
    """
    return _per_response(lm, query_ids, response_ids, lambda nll: math.exp(nll.mean().item()), batch_size, shard)


def response_logprobs(lm, *, query_ids: list[list[int]], response_ids: list[list[int]],
                      batch_size: int = 64, shard: Shard | None = None) -> list[float]:
    """log p(response | query) under `lm`, the sum over the response's tokens, for each pair (NaN if empty)."""
    return _per_response(lm, query_ids, response_ids, lambda nll: -nll.sum().item(), batch_size, shard)


def kl_to_reference(policy_logprobs: list[float], reference_logprobs: list[float]) -> float:
    """The mean over responses (sampled from the policy) of log pi(y|x) - log pi_ref(y|x), NaN pairs skipped.

    >>> kl_to_reference([-1.0, -2.0, math.nan], [-1.5, -3.5, -1.0])
    1.0
    """
    return nanmean([p - r for p, r in zip(policy_logprobs, reference_logprobs)])


def _per_response(lm, query_ids, response_ids, reduce, batch_size: int, shard: Shard | None) -> list[float]:
    """reduce(the NLL of each response token given the query and the tokens before it), for each pair.

    Pairs are right-padded into batches (padding after the last token cannot change earlier
    logits of a causal LM), on the model's device. Pairs with an empty response get NaN.
    `shard` (several processes) scores this process's batches and gathers all.
    """
    import torch
    import torch.nn.functional as F

    lm.eval()
    device, shard = next(lm.parameters()).device, shard or Shard()
    out = [math.nan] * len(query_ids)
    todo = [i for i, r in enumerate(response_ids) if r]
    local = {}
    for batch in shard.batches(-(-len(todo) // batch_size)):
        index = todo[batch * batch_size:(batch + 1) * batch_size]
        seqs = [query_ids[i] + response_ids[i] for i in index]
        width = max(len(s) for s in seqs)
        ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs], device=device)  # (B, T)
        attention = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs], device=device)  # (B, T)
        with torch.no_grad():
            logits = lm(input_ids=ids, attention_mask=attention).logits[:, :-1].float()  # (B, T-1, V)
        nll = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")  # (B, T-1)
        local[batch] = []
        for row, i in enumerate(index):
            q, r = len(query_ids[i]), len(response_ids[i])
            local[batch].append((i, reduce(nll[row, q - 1:q - 1 + r])))  # response tokens only
    for i, value in shard.gather(local):
        out[i] = value
    return out
