"""Truncated importance sampling (TIS) of an external engine's rollouts, and the gap that stops a round (issue 46,
item 4). Weights, losses and round stats against numbers computed here by hand; the rounds reuse the tiny GPT-2
and the engine-offset batches of tests/test_engine_logprobs.py.
"""
import math

import pytest
import torch

from pipeline.core.config import PPOParams
from pipeline.core.errors import PPOInputError
from pipeline.model.policy import frozen_copy
from pipeline.train.ppo import FixedKLController, RunningMoments, policy_loss, truncated_is_weights
from pipeline.train.trainer import make_optimizer, train_round
from pipeline.train.value_free import value_free_loss
from tests.test_engine_logprobs import round_batch, tiny_policy


def test_weights_are_the_trainer_over_engine_probability_ratio_truncated_at_the_cap():
    old = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -4.0, 0.0]])
    engine = torch.tensor([[-1.5, -2.0, -0.9], [-2.0, -3.0, -9.0]])  # row 1's last position is padding
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    weights, stats = truncated_is_weights(old_logprobs=old, engine_logprobs=engine, mask=mask, cap=2.0)
    # exp(old − engine): e^0.5 = 1.6487, e^0 = 1, e^-2.1 = 0.1225, e^1.5 = 4.4817 -> capped 2, e^-1 = 0.3679
    expected = torch.tensor([[math.exp(0.5), 1.0, math.exp(-2.1)], [2.0, math.exp(-1.0), 0.0]])
    assert torch.allclose(weights, expected, atol=1e-6)
    assert stats["is_capped_share"] == pytest.approx(1 / 5)
    assert stats["is_weight_mean"] == pytest.approx((math.exp(0.5) + 1 + math.exp(-2.1) + 2 + math.exp(-1)) / 5)
    assert not weights.requires_grad


def test_a_cap_that_is_not_positive_is_refused():
    with pytest.raises(ValueError, match="cap must be > 0, got 0"):
        truncated_is_weights(old_logprobs=torch.zeros(1, 2), engine_logprobs=torch.zeros(1, 2),
                             mask=torch.ones(1, 2), cap=0.0)


def test_policy_loss_multiplies_each_tokens_clipped_loss_by_its_weight():
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = torch.tensor([[-1.0, -2.5]])
    advantages = torch.tensor([[1.0, -2.0]])
    mask = torch.ones(1, 2)
    weights = torch.tensor([[0.5, 2.0]])
    loss, _ = policy_loss(logprobs=logprobs, old_logprobs=old, advantages=advantages, mask=mask, cliprange=0.2,
                          is_weights=weights)
    # token 0: ratio 1, loss −1; token 1: ratio e^0.5 = 1.6487, −A·ratio = 3.2974, −A·clip = 2.4 -> max 3.2974
    assert loss.item() == pytest.approx((0.5 * -1.0 + 2.0 * 2 * math.exp(0.5)) / 2, rel=1e-6)
    plain, _ = policy_loss(logprobs=logprobs, old_logprobs=old, advantages=advantages, mask=mask, cliprange=0.2)
    assert plain.item() == pytest.approx((-1.0 + 2 * math.exp(0.5)) / 2, rel=1e-6)


def test_without_weights_policy_loss_is_bit_identical():
    gen = torch.Generator().manual_seed(0)
    args = dict(logprobs=-torch.rand(3, 4, generator=gen), old_logprobs=-torch.rand(3, 4, generator=gen),
                advantages=torch.randn(3, 4, generator=gen), mask=torch.ones(3, 4), cliprange=0.2)
    ones, _ = policy_loss(**args, is_weights=torch.ones(3, 4))
    none, _ = policy_loss(**args)
    assert torch.equal(ones, none)


def test_value_free_token_losses_are_weighted():
    params = PPOParams(algorithm="reinforce_pp")
    logprobs = torch.tensor([[-1.0, -1.0]])
    tensors = {"old_logprobs": logprobs.clone(), "ref_logprobs": logprobs.clone(),
               "advantages": torch.tensor([[1.0, 3.0]]), "sequence_advantages": torch.zeros(1)}
    common = dict(logprobs=logprobs, mask=torch.ones(1, 2), kl_coef=0.0, rows=1, tokens=2.0, max_completion_length=2)
    plain = value_free_loss(params, tensors=tensors, **common)
    weighted = value_free_loss(params, tensors={**tensors, "is_weights": torch.tensor([[2.0, 0.5]])}, **common)
    assert plain.item() == pytest.approx(-(1.0 + 3.0) / 2)  # ratio 1: −A per token, a token mean
    assert weighted.item() == pytest.approx(-(2.0 * 1.0 + 0.5 * 3.0) / 2)


def run_round(batch, policy, **params):
    return train_round(policy=policy, ref_model=frozen_copy(policy), optimizer=make_optimizer(policy, 1e-3),
                       batch=batch, params=PPOParams(mini_batch_size=4, ppo_epochs=1, **params),
                       kl_controller=FixedKLController(0.1), score_moments=RunningMoments(), seed=0, progress=False)


@pytest.mark.parametrize("offset", [0.25, -0.3])  # -0.3: rows 2 and 3 capped
def test_a_round_on_engine_rollouts_logs_the_weights_by_hand(offset):
    policy = tiny_policy()
    batch, _ = round_batch(policy, engine_offset=offset)  # engine = trainer + offset·(b + 1) on row b
    first = run_round(batch, policy)[0]
    lengths = [5, 2, 4, 3]
    # old − engine = −offset·(b + 1) on every token of row b; weight exp(that), capped at 2.0
    weights = [min(math.exp(-offset * (b + 1)), 2.0) for b in range(4)]
    capped = [math.exp(-offset * (b + 1)) > 2.0 for b in range(4)]
    tokens = sum(lengths)
    assert first["is_weight_mean"] == pytest.approx(sum(w * n for w, n in zip(weights, lengths)) / tokens, abs=1e-5)
    assert first["is_capped_share"] == pytest.approx(sum(n for c, n in zip(capped, lengths) if c) / tokens)


def test_weights_change_the_update_and_a_null_cap_turns_them_off():
    batch, _ = round_batch(tiny_policy(), engine_offset=0.25)
    on = run_round(batch, tiny_policy())[0]
    off = run_round(batch, tiny_policy(), engine_is_cap=None)[0]
    assert "is_weight_mean" not in off and "engine_logprob_gap_mean" in off
    assert on["policy_loss"] != pytest.approx(off["policy_loss"], rel=1e-3)


def test_hf_rollouts_get_no_weights():
    batch, _ = round_batch(tiny_policy(), engine_offset=None)
    first = run_round(batch, tiny_policy())[0]
    assert "is_weight_mean" not in first and "engine_logprob_gap_mean" not in first


def test_a_gap_above_the_threshold_stops_the_round_in_one_line():
    batch, _ = round_batch(tiny_policy(), engine_offset=0.25)  # mean gap (0.25·5 + 0.5·2 + 0.75·4 + 1·3) / 14
    with pytest.raises(PPOInputError, match=r"0\.5893 nats .* above ppo.engine_gap_max = 0.5") as err:
        run_round(batch, tiny_policy(), engine_gap_max=0.5)
    assert "\n" not in str(err.value)
    run_round(batch, tiny_policy(), engine_gap_max=0.6)  # below it: the round runs
