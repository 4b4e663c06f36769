"""The sample-efficiency DVC experiment set, run for real on a shrunken demo project (3 arms x 1 seed x 1 round)."""
import json
import subprocess
from pathlib import Path

import pytest
from e2e import dvc, experiment_project, tiny_params

from benchmarks import sample_efficiency_dvc as se
from pipeline.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def test_rounds_overrides_and_arm_settings():
    assert se.rounds_overrides(None) == []
    assert se.rounds_overrides(2) == ["~rounds", "+rounds={0001: {prev: base}, 0002: {prev: 'round=0001'}}",
                                      "~chunks", "+chunks={}", "run.rounds_per_stage=1",
                                      "evaluate.policy='round=0002'"]
    assert se.rounds_overrides(8, 4)[2:5] == ["~chunks", "+chunks={0001: {prev: base, last: '0004'}, "
                                              "0005: {prev: 'round=0004', last: '0008'}}", "run.rounds_per_stage=4"]
    with pytest.raises(ConfigError, match="--per-stage 4 needs --rounds N"):
        se.rounds_overrides(None, 4)
    assert se.arm_settings("dense_selective", selective_threshold=0.25)["critic.threshold"] == 0.25
    assert se.arm_settings("dense_zero_mean", selective_threshold=0.0)["critic.zero_mean"] is True
    assert se.arm_settings("sparse_scaled", selective_threshold=0.0, k=2.5) == {
        "critic.enabled": False, "critic.threshold": se.ALL_THRESHOLD, "critic.zero_mean": False, "score.scale": 2.5,
        "ppo.algorithm": "ppo", "rollout.samples_per_prompt": 1}
    assert se.arm_settings("grpo_dense", selective_threshold=0.0) == {
        "critic.enabled": True, "critic.threshold": se.ALL_THRESHOLD, "critic.zero_mean": False, "score.scale": 1.0,
        "ppo.algorithm": "grpo", "rollout.samples_per_prompt": 4, "ppo.dense_weight": 1.0, "ppo.vf_coef": 0.0,
        "ppo.adap_kl_ctrl": False, "ppo.init_kl_coef": 0.04}


def test_every_arm_sets_a_valid_project_from_the_ppo_demo_and_from_the_grpo_demo():
    """Each arm's -S settings on params.yaml (PPO) and on configs/demo-grpo.yaml load as drlc check loads them:
    the GRPO arms make a PPO project value-free, the PPO arms make a GRPO project PPO with groups of 1."""
    from pipeline.core.config import load_params

    for profile in ("params.yaml", "configs/demo-grpo.yaml"):
        for arm in se.ARMS:
            settings = se.arm_settings(arm, selective_threshold=0.0, k=2.0 if arm == "sparse_scaled" else None)
            params = load_params(ROOT / profile, [f"{key}={json.dumps(value)}" for key, value in settings.items()])
            assert params.ppo.algorithm == ("grpo" if arm.startswith("grpo") else "ppo"), (profile, arm)
            assert params.rollout.samples_per_prompt == (4 if arm.startswith("grpo") else 1)
            assert params.critic.enabled == (arm.startswith("dense") or arm == "grpo_dense")


@pytest.mark.slow
@pytest.mark.long  # the synthetic arms; test_study_real_text runs the same machinery
def test_experiment_set_runs_and_collects_each_experiments_metrics(tmp_path, monkeypatch):
    project = experiment_project(tmp_path, tiny_params(n_rounds=2), monkeypatch)
    out = tmp_path / "se.json"
    result = se.main(["--project", str(project), "--seeds", "0", "--rounds", "1", "--scale-match", "std",
                      "--arms", "sparse", "dense_all", "dense_zero_mean", "--out", str(out)])
    written = json.loads(out.read_text())
    assert written["headline"] == json.loads(json.dumps(result["headline"]))
    assert set(written["runs"]) == {"sparse", "dense_all", "dense_zero_mean"}
    shown = json.loads(dvc(["exp", "show", "--json"], project).stdout)
    revs = {e["name"]: e["revs"][0]["data"] for c in shown for e in c.get("experiments") or []}
    for arm, runs in written["runs"].items():
        record, data = runs[0], revs[f"{arm}-s0"]
        curves = json.loads(subprocess.run(["git", "show", f"{record['rev']}:metrics/rounds.json"], cwd=project,
                                           capture_output=True, text=True, check=True).stdout)["rounds"]
        assert [r["env_reward"] for r in record["rounds"]] == [c["env_reward_mean"] for c in curves]  # scale 1
        assert [r["kl"] for r in record["rounds"]] == [c["kl"] for c in curves] and len(curves) == 1
        evaluated = data["metrics"]["metrics/eval.json"]["data"]["round=0001"]["world"]
        assert record["eval"]["world/env_reward_mean"] == evaluated["env_reward_mean"]
        assert record["eval"]["world/dist_2"] == evaluated["dist_2"]
        params = data["params"]["params.yaml"]["data"]
        assert list(params["rounds"]) == ["0001"] and params["run"]["seed"] == 0
        critique = data["metrics"]["metrics/critique/round=0001.json"]["data"]
        assert record["critic"]["critic_requests"] == critique["critic_requests"]
    assert written["runs"]["sparse"][0]["critic"]["critiqued"] == 0
    assert written["runs"]["sparse"][0]["critic"]["critic_requests"] == 0
    batch = tiny_params()["rollout"]["batch_size"]
    assert written["runs"]["dense_all"][0]["critic"]["critiqued"] == batch  # threshold above every reward
    assert written["runs"]["dense_all"][0]["critic"]["critic_requests"] > 0
    dense, centred = written["runs"]["dense_all"][0]["rounds"][0], written["runs"]["dense_zero_mean"][0]["rounds"][0]
    assert dense["intrinsic_reward_sum"] != 0.0 and centred["intrinsic_reward_sum"] == pytest.approx(0.0, abs=1e-6)
    assert centred["env_reward"] == dense["env_reward"]  # round 1 samples the same base policy, same seed
    table = out.with_suffix(".md").read_text()
    assert "| dense_all | " in table and "| sparse | " in table
