"""Evaluation metrics on small hand-checked examples."""
import math

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from pipeline.evaluate.metrics import conditional_perplexities, distinct_n, positive_share


def test_distinct_n_by_hand():
    # prompt 1: "a b a b" -> unigrams a,b,a,b: 2/4; bigrams ab,ba,ab: 2/3
    # prompt 2: "x y", "x z" -> unigrams x,y,x,z: 3/4; bigrams xy,xz: 2/2
    samples = [["a b a b"], ["x y", "x z"]]
    assert math.isclose(distinct_n(samples, 1), (2 / 4 + 3 / 4) / 2)
    assert math.isclose(distinct_n(samples, 2), (2 / 3 + 1.0) / 2)
    assert distinct_n([["one"]], 2) == 0.0  # no bigrams at all


def test_positive_share_uses_the_threshold_inclusively():
    assert positive_share([0.05, 0.04, -1.0, 0.9]) == 0.5


def test_conditional_perplexity_matches_a_direct_computation():
    torch.manual_seed(0)
    lm = GPT2LMHeadModel(GPT2Config(vocab_size=20, n_positions=16, n_embd=16, n_layer=1, n_head=2)).eval()
    query, response = [1, 2, 3], [4, 5]
    (ppl,) = conditional_perplexities(lm, query_ids=[query], response_ids=[response])
    with torch.no_grad():
        logp = torch.log_softmax(lm(input_ids=torch.tensor([query + response])).logits[0], -1)
    nll = -(logp[2, 4] + logp[3, 5]) / 2  # token 4 is predicted at position 2, token 5 at 3
    assert math.isclose(ppl, math.exp(nll.item()), rel_tol=1e-5)
    assert math.isnan(conditional_perplexities(lm, query_ids=[query], response_ids=[[]])[0])
