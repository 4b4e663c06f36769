"""The KL part of each token's reward as the ppo stage stores it (the `kl_rewards` table, `drlc view`'s KL shading).

- token_kl_rewards against hand numbers for each algorithm, and against total_rewards' own kl_rewards (bit for bit);
- ppo_round's kl_rewards rows equal −β·(behaviour log-prob − reference log-prob) computed here from the base model
  with response_logprobs, for every response token, and their table round-trips through the store.
"""
from __future__ import annotations

import pytest
import torch

from pipeline.core import store
from pipeline.core.config import PPOParams
from pipeline.model.logprobs import response_logprobs
from pipeline.model.policy import load_policy
from pipeline.steps.ppo_round import ppo_round
from pipeline.train.ppo import token_kl_rewards, total_rewards
from tests.test_resume import PAD, round_tables, save_tiny_base

torch.set_num_threads(1)
KL = torch.tensor([[0.1, -0.2, 0.3], [0.05, 0.0, 0.0]])  # (B, T), already masked as the trainer's
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, 0.0, 0.0]])
REF = torch.tensor([[-1.5, -1.0, -0.5], [-0.2, -9.0, -9.0]])


def flat(rows):
    return [v for row in rows for v in row]


def test_ppo_and_reinforce_pp_store_minus_beta_kl_per_response_token():
    for algorithm in ("ppo", "reinforce_pp"):
        got = token_kl_rewards(algorithm, kl=KL, old_logprobs=OLD, ref_logprobs=REF, mask=MASK, kl_coef=0.2)
        assert flat(got) == pytest.approx([-0.02, 0.04, -0.06, -0.01], abs=1e-7) and [len(g) for g in got] == [3, 1]
    _, kl_rewards = total_rewards(env_rewards=torch.tensor([1.0, 2.0]), kl=KL, intrinsic_rewards=torch.zeros(2, 3),
                                  mask=MASK, kl_coef=0.2)
    got = token_kl_rewards("ppo", kl=KL, old_logprobs=OLD, ref_logprobs=REF, mask=MASK, kl_coef=0.2)
    assert got == [kl_rewards[0].tolist(), kl_rewards[1, :1].tolist()]  # the values the rewards used, bit for bit


def test_rloo_stores_the_k1_terms_of_its_sequence_penalty_and_grpo_none():
    got = token_kl_rewards("rloo", kl=KL, old_logprobs=OLD, ref_logprobs=REF, mask=MASK, kl_coef=0.1)
    assert flat(got) == pytest.approx([-0.05, 0.1, 0.0, 0.05], abs=1e-7)  # −0.1·(old − ref)
    assert [len(g) for g in got] == [3, 1]  # padding left out
    assert token_kl_rewards("grpo", kl=KL, old_logprobs=OLD, ref_logprobs=REF, mask=MASK, kl_coef=0.1) == [None, None]


def test_ppo_round_rows_are_minus_beta_times_behaviour_minus_reference_logprobs(tmp_path):
    base = tmp_path / "base"
    save_tiny_base(base)
    policy, _ = load_policy(base)
    rollouts, scores, annotations = round_tables(policy, 1)
    for r in rollouts:  # sampled by the reference itself: shift them, so the KL is not float noise
        r["behaviour_logprobs"] = [lp + 0.1 * (j % 3) for j, lp in enumerate(r["behaviour_logprobs"])]
    params = PPOParams(learning_rate=1e-2, mini_batch_size=8, ppo_epochs=1, init_kl_coef=0.05)
    rows: list[dict] = []
    ppo_round(rollouts, scores, annotations, policy_dir=str(base), reference_dir=str(base),
              out_dir=str(tmp_path / "r1"), params=params, run_id="t", round_=1, seed=3, kl_rewards=rows)
    with torch.no_grad():
        ref = response_logprobs(policy, query_ids=[r["query_ids"] for r in rollouts],
                                response_ids=[r["response_ids"] for r in rollouts], pad_id=PAD).logprobs
    assert [r["rollout_id"] for r in rows] == [r["rollout_id"] for r in rollouts]
    for row, rollout, ref_row in zip(rows, rollouts, ref):
        n = len(rollout["response_ids"])
        expected = [-0.05 * (b - float(q)) for b, q in zip(rollout["behaviour_logprobs"], ref_row[:n])]
        assert row["kl_reward"] == pytest.approx(expected, abs=1e-6)
        assert (row["algorithm"], row["kl_penalty"], row["kl_coef"]) == ("ppo", "kl", 0.05)
    assert any(abs(v) > 1e-3 for row in rows for v in row["kl_reward"])
    folder = store.partition_dir(tmp_path / "data", "kl_rewards", 1)
    store.write_table(rows, "kl_rewards", folder)
    assert store.read_table(folder, "kl_rewards")[0]["kl_reward"] == pytest.approx(rows[0]["kl_reward"])
