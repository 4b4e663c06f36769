"""Per-response length limits in the rollout step (rollout.min_new_tokens, legacy TRL's LengthSampler)."""
import pytest
import torch
from conftest import REVIEW_PROMPTS, save_tiny_gpt2, tiny_review_policy, train_bpe

from pipeline.data.world import generate_reviews
from pipeline.model.logprobs import response_logprobs
from pipeline.model.policy import load_policy
from pipeline.steps.rollout import response_limits, rollout

PROMPTS = REVIEW_PROMPTS


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    return tiny_review_policy(tmp_path_factory)


def run(policy_dir, **kw):
    args = dict(policy_dir=policy_dir, policy_name="base", run_id="t", round_=1, seed=0, batch_size=24,
                max_new_tokens=9, generation_batch_size=8)
    return rollout(PROMPTS, **{**args, **kw})


def test_limits_are_uniform_in_min_max_inclusive_and_seeded():
    limits = response_limits(4000, min_new_tokens=15, max_new_tokens=20, seed=3)
    assert set(limits) == set(range(15, 21))
    counts = [limits.count(k) for k in range(15, 21)]
    assert max(counts) - min(counts) < 150  # about 667 each
    assert limits == response_limits(4000, min_new_tokens=15, max_new_tokens=20, seed=3)
    assert limits != response_limits(4000, min_new_tokens=15, max_new_tokens=20, seed=4)
    assert response_limits(3, min_new_tokens=None, max_new_tokens=7, seed=0) == [7, 7, 7]


def test_each_response_is_within_its_drawn_limit_and_deterministic(policy_dir):
    rows = run(policy_dir, min_new_tokens=3)
    limits = [r["max_new_tokens"] for r in rows]
    assert all(3 <= k <= 9 for k in limits) and len(set(limits)) > 2
    eos = load_policy(policy_dir)[1].eos_token_id
    for r in rows:
        n = len(r["response_ids"])
        assert n == len(r["behaviour_logprobs"])
        assert n == r["max_new_tokens"] or (n < r["max_new_tokens"] and r["response_ids"][-1] == eos)
    assert run(policy_dir, min_new_tokens=3) == rows
    assert [r["max_new_tokens"] for r in run(policy_dir, min_new_tokens=3, seed=1)] != limits


def test_a_cut_response_is_the_prefix_of_the_same_seeds_full_length_sample(policy_dir):
    cut, full = run(policy_dir, min_new_tokens=2), run(policy_dir)
    assert all(r["max_new_tokens"] == 9 for r in full)
    for c, f in zip(cut, full):
        k = len(c["response_ids"])
        assert c["response_ids"] == f["response_ids"][:k]
        assert c["behaviour_logprobs"] == f["behaviour_logprobs"][:k]


def test_cut_behaviour_logprobs_equal_a_fresh_pass(policy_dir):
    rows = run(policy_dir, min_new_tokens=2)
    policy, tokenizer = load_policy(policy_dir)
    with torch.no_grad():
        fresh = response_logprobs(policy, query_ids=[r["query_ids"] for r in rows],
                                  response_ids=[r["response_ids"] for r in rows], pad_id=tokenizer.pad_token_id)
    for b, r in enumerate(rows):
        n = len(r["response_ids"])
        assert fresh.logprobs[b, :n].tolist() == pytest.approx(r["behaviour_logprobs"], abs=1e-5)


def test_a_gpt2_style_tokenizer_without_bos_and_pad_equal_to_eos_works(tmp_path):
    tokenizer = train_bpe(generate_reviews(300, seed=0))
    tokenizer.pad_token = tokenizer.eos_token
    policy_dir = save_tiny_gpt2(tmp_path, tokenizer)
    rows = run(policy_dir, min_new_tokens=4)
    assert all(r["query_ids"] == tokenizer.encode(r["query"]) for r in rows)  # no BOS prepended
    assert all(len(r["response_ids"]) <= r["max_new_tokens"] for r in rows)
