"""Exact resume for the value-free algorithms: round 2 trained by the ppo stage's code from round 1's checkpoint
on disk (no value head in it) equals rounds 1 and 2 run in one go (the PPO version: tests/test_resume.py, whose
tiny base and tables this reuses, each rollout row given its sample_index in groups of 2)."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from test_resume import PARAMS, SEED, as_batch, round_tables, save_tiny_base, without_timing

from pipeline.core.seeding import round_seed
from pipeline.model.policy import load_policy, load_reference
from pipeline.steps.ppo_round import new_kl_controller, ppo_round, step_row
from pipeline.train.ppo import RunningMoments
from pipeline.train.trainer import make_optimizer, train_round


def grouped(tables):
    rollouts, scores, annotations = tables
    return [{**r, "sample_index": i % 2} for i, r in enumerate(rollouts)], scores, annotations


@pytest.mark.parametrize("algorithm", ["grpo", "reinforce_pp"])
def test_resumed_round_2_equals_uninterrupted_run(tmp_path, algorithm):
    base = tmp_path / "base"
    save_tiny_base(base)
    params = dataclasses.replace(PARAMS, algorithm=algorithm, vf_coef=0.0, loss_type="dapo")
    policy, _ = load_policy(base, seed=SEED, value_head=False)
    reference = load_reference(base)
    optimizer, controller, moments = make_optimizer(policy, params.learning_rate), new_kl_controller(params), \
        RunningMoments()
    rounds = {}
    for round_ in (1, 2):
        torch.manual_seed(round_seed(SEED, round_, 3))
        tables = grouped(round_tables(policy, round_))
        stats = train_round(policy=policy, ref_model=reference, optimizer=optimizer, batch=as_batch(*tables),
                            params=params, kl_controller=controller, score_moments=moments,
                            seed=round_seed(SEED, round_, 4), progress=False, group_size=2)
        rounds[round_] = {"tables": tables, "rows": [step_row(s, run_id="t", round_=round_, step=i)
                                                     for i, s in enumerate(stats)],
                          "weights": {k: v.clone() for k, v in policy.state_dict().items()}}
    previous = base
    for round_ in (1, 2):
        out = tmp_path / f"round={round_:04d}"
        rows = ppo_round(*rounds[round_]["tables"], policy_dir=str(previous), reference_dir=str(base),
                         out_dir=str(out), params=params, run_id="t", round_=round_, seed=SEED)
        assert without_timing(rows) == without_timing(rounds[round_]["rows"])
        assert not (out / "value_head.safetensors").exists()
        weights = load_policy(out, value_head=False)[0].state_dict()
        assert weights.keys() == rounds[round_]["weights"].keys()
        assert all(torch.equal(weights[k], rounds[round_]["weights"][k]) for k in weights), f"round {round_}"
        previous = out
