"""Evaluation metrics on small hand-checked examples."""
import math

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from pipeline.evaluate.metrics import (conditional_perplexities, distinct_n, kl_to_reference, nanmean, positive_percent,
                                      positive_share, response_logprobs)


def test_distinct_n_is_distinct_ngrams_over_words_as_in_dexperts():
    # prompt 1: "a b a b" -> 4 words; unigrams {a, b}: 2/4; bigrams {ab, ba}: 2/4; trigrams {aba, bab}: 2/4
    # prompt 2: "x y", "x z" -> 4 words; unigrams {x, y, z}: 3/4; bigrams {xy, xz}: 2/4; trigrams: 0/4
    samples = [["a b a b"], ["x y", "x z"]]
    assert math.isclose(distinct_n(samples, 1), (2 / 4 + 3 / 4) / 2)
    assert math.isclose(distinct_n(samples, 2), (2 / 4 + 2 / 4) / 2)
    assert math.isclose(distinct_n(samples, 3), (2 / 4 + 0 / 4) / 2)
    assert distinct_n([["one"]], 2) == 0.0  # one word, no bigram
    assert distinct_n([["", "  "], ["p q"]], 1) == 1.0  # a prompt without words is left out
    assert distinct_n([], 1) == 0.0


def test_positive_share_and_percent_use_the_threshold_inclusively():
    assert positive_share([0.05, 0.04, -1.0, 0.9]) == 0.5
    assert positive_percent([0.5, 0.49, 0.9, 0.1]) == 50.0
    assert positive_percent([]) == 0.0


def test_nanmean_skips_nan():
    assert nanmean([1.0, math.nan, 3.0]) == 2.0
    assert math.isnan(nanmean([math.nan]))


def _tiny_lm():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=20, n_positions=16, n_embd=16, n_layer=1, n_head=2)).eval()


def test_conditional_perplexity_matches_a_direct_computation():
    lm = _tiny_lm()
    query, response = [1, 2, 3], [4, 5]
    (ppl,) = conditional_perplexities(lm, query_ids=[query], response_ids=[response])
    with torch.no_grad():
        logp = torch.log_softmax(lm(input_ids=torch.tensor([query + response])).logits[0], -1)
    nll = -(logp[2, 4] + logp[3, 5]) / 2  # token 4 is predicted at position 2, token 5 at 3
    assert math.isclose(ppl, math.exp(nll.item()), rel_tol=1e-5)
    assert math.isnan(conditional_perplexities(lm, query_ids=[query], response_ids=[[]])[0])


def test_batched_perplexity_equals_one_pair_at_a_time():
    lm = _tiny_lm()
    queries = [[1, 2, 3], [7], [4, 4, 4, 4, 4], [9, 8]]
    responses = [[4, 5], [6, 7, 8, 9, 10, 11], [], [1]]
    batched = conditional_perplexities(lm, query_ids=queries, response_ids=responses, batch_size=3)
    single = [conditional_perplexities(lm, query_ids=[q], response_ids=[r], batch_size=1)[0]
              for q, r in zip(queries, responses)]
    assert math.isnan(batched[2]) and math.isnan(single[2])
    for b, s in zip(batched[:2] + batched[3:], single[:2] + single[3:]):
        assert math.isclose(b, s, rel_tol=1e-4)


def test_response_logprobs_and_kl_to_reference_match_a_direct_computation():
    policy = _tiny_lm()
    torch.manual_seed(1)
    reference = GPT2LMHeadModel(GPT2Config(vocab_size=20, n_positions=16, n_embd=16, n_layer=1, n_head=2)).eval()
    queries, responses = [[1, 2, 3], [7], [9, 8]], [[4, 5], [6, 7, 8], []]

    def by_hand(lm, query, response):  # one pair, no batching: sum over response tokens of log p
        with torch.no_grad():
            logp = torch.log_softmax(lm(input_ids=torch.tensor([query + response])).logits[0], -1)
        return sum(logp[len(query) - 1 + t, token].item() for t, token in enumerate(response))

    batched = {name: response_logprobs(lm, query_ids=queries, response_ids=responses, batch_size=2)
               for name, lm in (("policy", policy), ("reference", reference))}
    for name, lm in (("policy", policy), ("reference", reference)):
        for got, q, r in zip(batched[name][:2], queries, responses):
            assert math.isclose(got, by_hand(lm, q, r), rel_tol=1e-5)
        assert math.isnan(batched[name][2])  # an empty response has no tokens to score
    kl = kl_to_reference(batched["policy"], batched["reference"])
    expected = sum(by_hand(policy, q, r) - by_hand(reference, q, r) for q, r in zip(queries[:2], responses[:2])) / 2
    assert math.isclose(kl, expected, rel_tol=1e-5)
    assert kl_to_reference(batched["policy"], batched["policy"]) == 0.0
