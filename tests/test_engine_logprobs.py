"""Old log-probs of rollouts from an external engine (rollout.engine: vllm; issue 39, section 2).

vLLM's log-probs are not the trainer's numbers, so for rows with `engine_logprobs` the PPO round takes the
training model's own no-grad log-probs as the old log-probs, and records the gap to the engine's numbers
(max and mean |Δ| over response tokens). These tests check both against numbers computed here by hand: a
plain forward pass of the LM and log_softmax, not drlc's response_logprobs. The vLLM runs themselves are in
tests/test_vllm_rollouts.py (slow, in the `vllm` extra's venv).
"""
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from pipeline.core.config import PPOParams
from pipeline.model.policy import PolicyWithValueHead, frozen_copy
from pipeline.train.ppo import FixedKLController, RunningMoments
from pipeline.train.trainer import RolloutBatch, engine_logprob_gap, make_optimizer, old_logprobs_of, train_round


def test_gap_is_max_and_token_mean_of_abs_difference_over_response_tokens():
    old = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -4.0, 0.0]])  # (B=2, T=3)
    engine = torch.tensor([[-1.5, -2.0, -2.9], [-0.5, -3.0, 9.0]])  # row 1's last position is padding
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    gap = engine_logprob_gap(old_logprobs=old, engine_logprobs=engine, mask=mask)
    # |Δ| on the 5 response tokens: 0.5, 0, 0.1, 0, 1.0 (the padding's 9 counts nowhere)
    assert gap["engine_logprob_gap_max"] == pytest.approx(1.0)
    assert gap["engine_logprob_gap_mean"] == pytest.approx(1.6 / 5)


def test_old_logprobs_are_the_recorded_ones_unless_an_engine_sampled():
    fresh = torch.tensor([[-1.0, -2.0], [-3.0, 0.0]])
    rows = dict(query_ids=[[1], [2]], response_ids=[[3, 4], [5]], behaviour_logprobs=[[-1.1, -2.1], [-3.1]],
                env_rewards=[0.0, 1.0], intrinsic_rewards=[[0.0, 0.0], [0.0]])
    recorded = old_logprobs_of(RolloutBatch(**rows), fresh_logprobs=fresh, width=2)
    assert torch.allclose(recorded, torch.tensor([[-1.1, -2.1], [-3.1, 0.0]]))
    engine = RolloutBatch(**rows, engine_logprobs=[[-1.1, -2.1], [-3.1]])
    assert old_logprobs_of(engine, fresh_logprobs=fresh, width=2) is fresh


def tiny_policy(seed: int = 0) -> PolicyWithValueHead:
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=40, n_positions=32, n_embd=16, n_layer=1, n_head=2, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0)
    return PolicyWithValueHead(GPT2LMHeadModel(config), torch.nn.Linear(16, 1)).eval()


def by_hand_logprobs(lm, query_ids, response_ids) -> list[list[float]]:
    """Each response token's log-prob under `lm`: one unpadded forward of query + response, log_softmax."""
    out = []
    with torch.no_grad():
        for query, response in zip(query_ids, response_ids):
            ids = torch.tensor([query + response])  # (1, Q + R)
            logp = torch.log_softmax(lm(input_ids=ids).logits[0].double(), dim=-1)  # (Q + R, V)
            out.append([logp[len(query) - 1 + t, token].item() for t, token in enumerate(response)])
    return out


def round_batch(policy, *, engine_offset: float | None, algorithm: str = "ppo"):
    gen = torch.Generator().manual_seed(1)
    queries = [torch.randint(1, 40, (3,), generator=gen).tolist() for _ in range(4)]
    responses = [torch.randint(1, 40, (n,), generator=gen).tolist() for n in (5, 2, 4, 3)]  # B = 4, T = 5
    true = by_hand_logprobs(policy.lm, queries, responses)
    # an engine whose numbers are off by a known amount per token: the offsets of row b are offset·(b + 1)
    engine = None if engine_offset is None else [[lp + engine_offset * (b + 1) for lp in row]
                                                   for b, row in enumerate(true)]
    batch = RolloutBatch(query_ids=queries, response_ids=responses,
                         behaviour_logprobs=engine if engine is not None else true,
                         env_rewards=[1.0, -1.0, 0.5, 0.0], intrinsic_rewards=[[0.0] * len(r) for r in responses],
                         engine_logprobs=engine)
    return batch, true


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_round_on_engine_rollouts_trains_from_recomputed_old_logprobs_and_reports_the_gap(algorithm):
    policy = tiny_policy()
    batch, true = round_batch(policy, engine_offset=0.25)
    params = PPOParams(mini_batch_size=4, ppo_epochs=1, algorithm=algorithm)
    stats = train_round(policy=policy, ref_model=frozen_copy(policy), optimizer=make_optimizer(policy, 1e-3),
                        batch=batch, params=params, kl_controller=FixedKLController(0.1),
                        score_moments=RunningMoments(), seed=0, progress=False, group_size=2)
    first = stats[0]
    # the old log-probs are the model's own: the first step's ratio is 1 and its k1 KL 0 (up to fp32 noise),
    # although the engine's numbers are 0.25-1.0 nats off
    assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert abs(first["policy_kl"]) < 1e-5
    # gap by hand: row b is off by 0.25·(b + 1) on each of its tokens
    lengths = [5, 2, 4, 3]
    assert first["engine_logprob_gap_max"] == pytest.approx(1.0, abs=1e-5)
    assert first["engine_logprob_gap_mean"] == pytest.approx(
        sum(0.25 * (b + 1) * n for b, n in enumerate(lengths)) / sum(lengths), abs=1e-5)
    assert all(s["engine_logprob_gap_max"] == first["engine_logprob_gap_max"] for s in stats)
    # and the fresh pass the gap is measured from is the model's log-prob, computed independently
    assert max(abs(e - t) for row_e, row_t in zip(batch.engine_logprobs, true)
               for e, t in zip(row_e, row_t)) == pytest.approx(first["engine_logprob_gap_max"], abs=1e-5)


def test_the_same_wrong_numbers_as_behaviour_logprobs_move_the_ratio():
    """Without engine_logprobs the recorded numbers are the old log-probs: the same batch's ratio is off by
    exp(-offset), so the recomputation above is what keeps it at 1."""
    policy = tiny_policy()
    batch, _ = round_batch(policy, engine_offset=0.25)
    batch = RolloutBatch(**{**batch.__dict__, "engine_logprobs": None})
    stats = train_round(policy=policy, ref_model=frozen_copy(policy), optimizer=make_optimizer(policy, 1e-3),
                        batch=batch, params=PPOParams(mini_batch_size=4, ppo_epochs=1),
                        kl_controller=FixedKLController(0.1), score_moments=RunningMoments(), seed=0, progress=False)
    assert stats[0]["ratio_mean"] < 0.9
    assert "engine_logprob_gap_max" not in stats[0]


def test_engine_logprobs_of_the_wrong_length_are_an_error_naming_the_row():
    from pipeline.core.errors import PPOInputError
    from pipeline.train.trainer import validate_batch

    batch, _ = round_batch(tiny_policy(), engine_offset=0.0)
    bad = RolloutBatch(**{**batch.__dict__, "engine_logprobs": [batch.engine_logprobs[0]] + [[0.0]] * 3})
    with pytest.raises(PPOInputError, match="Row 1: engine_logprobs has 1 values for 2 response tokens"):
        validate_batch(bad, PPOParams(mini_batch_size=4))
