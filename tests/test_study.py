"""`drlc study` without DVC: the shipped arms on real profiles, the commands, the report maths by hand.

The real DVC run of the command is tests/test_study_dvc.py (slow)."""
import json
import math
from pathlib import Path

import pytest

from pipeline.commands import study
from pipeline.core.config import load_params
from pipeline.core.errors import ConfigError, DataError
from pipeline.studies import study_report
from pipeline.studies.analysis import first_reaching, interval, paired_difference, seed_mean_points, t975

ROOT = Path(__file__).resolve().parents[1]


def arm_params(profile: str, arm: str, k: float = 2.0):
    plain = load_params(ROOT / profile)
    settings = study.matched_settings(study.load_arms()[arm], k, plain.ppo.init_kl_coef * plain.score.scale)
    sets = [f"{key}={json.dumps(value)}" for key, value in settings.items()]
    return load_params(ROOT / profile, sets + ["run.seed=3"])


@pytest.mark.parametrize("profile", ["params.yaml", "configs/commongen.yaml", "configs/demo-grpo.yaml",
                                     "configs/study-sentiment.yaml", "configs/study-toxicity.yaml",
                                     "configs/study-summarization.yaml", "configs/study-detox.yaml"])
def test_every_shipped_arm_makes_a_valid_project_of_the_profile(profile):
    configured = load_params(ROOT / profile).critic
    expect = {"sparse": (False, "tokens", "ppo"), "dense": (True, "tokens", "ppo"), "summed": (True, "summed", "ppo"),
              "random": (True, "random", "ppo"), "sparse_scaled": (False, None, "ppo"),
              "sparse_lowkl": (False, None, "ppo"), "dense_scaled": (True, "tokens", "ppo"),
              "grpo_sparse": (False, None, "grpo"), "grpo_dense": (True, "tokens", "grpo"),
              "dense_zero_mean": (True, "tokens", "ppo"), "grpo_random": (True, "random", "grpo")}
    critics = {"dense_lexicon": ("lexicon", None, "text"), "dense_smol_copy": ("hf", "base", "copy"),
               "dense_smol_text": ("hf", "base", "text")}  # another critic: (backend, model_dir, answer_format)
    assert set(study.load_arms()) == set(expect) | set(critics)
    for arm, picked in critics.items():
        params = arm_params(profile, arm)
        assert (params.critic.backend, params.critic.model_dir, params.critic.answer_format) == picked, arm
        assert params.critic.enabled and params.critic.placement == "tokens" and params.ppo.algorithm == "ppo", arm
        assert params.critic.threshold == configured.threshold and params.critic.zero_mean is False, arm
    for arm, (enabled, placement, algorithm) in expect.items():
        params = arm_params(profile, arm)
        assert params.critic.enabled is enabled and params.run.seed == 3, arm
        if placement:
            assert params.critic.placement == placement, arm
        assert params.ppo.algorithm == algorithm, arm
        assert params.rollout.samples_per_prompt == (4 if algorithm == "grpo" else 1), arm
        assert params.critic.zero_mean is (arm == "dense_zero_mean"), arm
        # the critic the arm uses is the configured one: no arm changes its backend, template, threshold or rewards
        same = ("backend", "template", "threshold", "rewards", "model_dir", "cache_dir")
        assert all(getattr(params.critic, key) == getattr(configured, key) for key in same), arm
    assert [arm_params(profile, arm, k=2.5).score.scale for arm in ("sparse_scaled", "dense_scaled")] == [2.5, 2.5]
    # sparse_lowkl: the reward as it is, the KL coefficient divided by k, the controller's other settings kept
    plain, low = load_params(ROOT / profile).ppo, arm_params(profile, "sparse_lowkl", k=2.5)
    # k = 2.5 is a score.scale: 2.5 / the profile's scale times the profile's reward, so beta is divided by that
    scale = load_params(ROOT / profile).score.scale
    assert low.score.scale == scale and low.ppo.init_kl_coef == pytest.approx(plain.init_kl_coef * scale / 2.5)
    assert (low.ppo.adap_kl_ctrl, low.ppo.target, low.ppo.horizon) == (plain.adap_kl_ctrl, plain.target, plain.horizon)


@pytest.mark.parametrize("profile", ["params.yaml", "configs/commongen.yaml"])
def test_the_ppo_arms_of_a_seed_share_what_decides_its_prompts_and_first_rollouts(profile):
    """Pairing: prompts come from prepare (run.run_id, run.task, run.seed, world, base), rollouts from the rollout
    stage (run.run_id, run.seed, run.device, rollout; dvc.yaml) and round 1 samples the base. Every PPO arm of a
    seed has the same values of all of them, so it samples the same prompts each round and the same round-1
    rollouts (DVC restores them from its run cache: tests/test_study_dvc.py checks the hashes)."""
    import yaml

    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    read = sorted(set(stages["prepare"]["params"] + stages["base"]["params"] + stages["rollout"]["do"]["params"]))
    assert {"run.seed", "world", "rollout"} <= set(read)

    def inputs(arm):
        p = arm_params(profile, arm)
        values = []
        for key in read:  # every params key (or section) the prompts and the rollouts depend on, as loaded
            value = p
            for part in key.split("."):
                value = getattr(value, part)
            values.append(repr(value))
        return tuple(values)

    ppo_arms = [arm for arm in study.load_arms() if not arm.startswith("grpo")]
    assert len({inputs(arm) for arm in ppo_arms}) == 1
    assert inputs("sparse") == inputs("dense") != inputs("grpo_dense")  # GRPO samples groups: other rollouts


def test_arms_file_errors_name_the_bad_arm(tmp_path):
    bad = tmp_path / "arms.yaml"
    bad.write_text("mine:\n  enabled: false\n")
    with pytest.raises(ConfigError, match="arm 'mine' must map dotted params keys"):
        study.load_arms(bad)
    with pytest.raises(ConfigError, match="not found"):
        study.load_arms(tmp_path / "none.yaml")
    with pytest.raises(ConfigError, match=r"unknown arm\(s\) \['densest'\]"):
        study.pick_arms(study.load_arms(), ["sparse", "densest"])
    with pytest.raises(ConfigError, match=r"\['sparse_scaled'\] match k from the sparse and dense arms"):
        study.pick_arms(study.load_arms(), ["sparse", "sparse_scaled"])
    with pytest.raises(ConfigError, match=r"\['sparse_lowkl'\] match k"):
        study.pick_arms(study.load_arms(), ["dense", "sparse_lowkl"])


def test_queue_command_by_hand():
    cmd = study.queue_command("dense", 2, {"critic.enabled": True, "critic.extra_body": {"drlc_seed": 1}},
                              ["~rounds", "+rounds={}"])
    assert cmd == ["dvc", "exp", "run", "--queue", "-n", "dense-s2", "-S", "run.seed=2", "-S", "critic.enabled=true",
                   "-S", "++critic.extra_body={drlc_seed: 1}", "-S", "~rounds", "-S", "+rounds={}"]


def test_a_killed_run_leaves_running_entries_that_are_found_only_when_no_worker_is_up():
    """`dvc queue status` as a killed session left it (the CommonGen study's own queue): summed-s0 Running, no worker."""
    killed = ("Task     Name       Created    Status\n"
              "6d60923  summed-s0  01:39 PM   Running\n"
              "cbb7350  random-s0  01:39 PM   Queued\n"
              "578a14e  dense-s0   01:39 PM   Failed\n"
              "aeeb834  sparse-s0  01:39 PM   Success\n\n"
              "Worker status: 0 active, 0 idle\n")
    assert study.stale_running(killed, alive=False) == ["summed-s0"]
    assert study.stale_running(killed, alive=True) == []  # a live worker's experiment is left


def test_a_worker_is_alive_while_its_process_runs_and_not_after_it_exited(tmp_path):
    import os

    celery = tmp_path / ".dvc/tmp/exps/celery"
    celery.mkdir(parents=True)
    assert not study.worker_alive(tmp_path)
    info = celery / "dvc-exp-worker-1.json"  # the file DVC's ManagedProcess keeps for a worker
    info.write_text(json.dumps({"pid": os.getpid(), "returncode": None}))
    assert study.worker_alive(tmp_path)
    info.write_text(json.dumps({"pid": os.getpid(), "returncode": 0}))
    assert not study.worker_alive(tmp_path)


def test_finished_experiments_keep_only_committed_ones():
    done = {"rev": "a" * 40, "params": {"params.yaml": {"data": {"run": {"seed": 0}}}},
            "metrics": {"metrics/eval.json": {"data": {"base": {}}}}}
    shown = [{"rev": "HEAD", "experiments": [
        {"name": "dense-s0", "revs": [{"data": done}]},
        {"name": "sparse-s0", "revs": [{"data": {"rev": "workspace", "params": {}}}]},  # still running
        # as a killed session left them in the CommonGen study: a failed entry and a queued one, each under a full rev
        {"name": "summed-s0", "revs": [{"error": {"msg": "Experiment run failed", "type": ""},
                                        "data": {**done, "rev": "b" * 40, "metrics": {"metrics/eval.json": None}}}]},
        {"name": "random-s0", "revs": [{"error": None, "data": {**done, "rev": "c" * 40, "metrics": {}}}]}]}]
    assert study.finished_experiments(shown) == {"dense-s0": {
        "rev": "a" * 40, "params": {"run": {"seed": 0}}, "metrics": {"metrics/eval.json": {"base": {}}}}}


def test_a_finished_experiment_with_other_settings_is_named_not_collected():
    params = {"run": {"seed": 1}, "critic": {"enabled": True, "placement": "tokens"}, "score": {"scale": 3.0},
              "evaluate": {"policy": "round=0004"}}
    arms = study.load_arms()
    assert study.mismatch(params, {"critic.enabled": True, "critic.placement": "tokens"}, 1, 4) is None
    assert study.mismatch(params, arms["summed"], 1, None) == "ppo.algorithm='ppo' (experiment: None)"
    assert study.mismatch(params, {"critic.placement": "summed"}, 1, None) == \
        "critic.placement='summed' (experiment: 'tokens')"
    assert study.mismatch(params, {"critic.enabled": True}, 2, None) == "run.seed=2 (experiment: 1)"
    assert study.mismatch(params, {"critic.enabled": True}, 1, 2) == \
        "evaluate.policy='round=0002' (experiment: 'round=0004')"
    assert study.mismatch(params, {"score.scale": study.MATCHED}, 1, None) is None  # k is the study's to choose
    # a grid at another -S (a length sweep's rollout.max_new_tokens) never collects this experiment
    longer = {**params, "rollout": {"max_new_tokens": 24}}
    assert study.mismatch(longer, {}, 1, None, ["rollout.max_new_tokens=24"]) is None
    assert study.mismatch(longer, {}, 1, None, ["rollout.max_new_tokens=64"]) == \
        "rollout.max_new_tokens=64 (experiment: 24)"


def test_a_partial_report_takes_k_from_the_scaled_experiments_that_ran():
    def ran(k):
        return {"rev": "a" * 40, "params": {"score": {"scale": k}}, "metrics": {}}
    done = {"sparse_scaled-s0": ran(2.5), "sparse_scaled-s1": ran(2.5)}
    assert study.scale_run_with(done, [("sparse_scaled", 0), ("sparse_scaled", 1)]) == 2.5
    assert study.scale_run_with(done, []) is None  # none finished: the report has no k
    with pytest.raises(DataError, match=r"different k: .*'sparse_scaled-s1': 3\.0"):
        study.scale_run_with({**done, "sparse_scaled-s1": ran(3.0)}, [("sparse_scaled", 0), ("sparse_scaled", 1)])
    # sparse_lowkl's k is read back from its coefficient: the project's 0.2 / its 0.08 = 2.5
    arms = study.load_arms()
    lowkl = {"rev": "b" * 40, "params": {"score": {"scale": 1.0}, "ppo": {"init_kl_coef": 0.2 / 2.5}}, "metrics": {}}
    both = [("sparse_scaled", 0), ("sparse_lowkl", 0)]
    assert study.scale_run_with({**done, "sparse_lowkl-s0": lowkl}, both, arms, 0.2) == pytest.approx(2.5)
    with pytest.raises(DataError, match="sparse_lowkl-s0"):
        study.scale_run_with({**done, "sparse_lowkl-s0": lowkl}, both, arms, 0.3)


def test_sparse_lowkl_divides_beta_by_k_relative_to_the_projects_scale():
    # a project whose PPO reads 0.01 x the task's reward (the summarization demo): dense matches sparse at
    # score.scale k = 0.025, a reward 2.5 times the project's, so sparse_lowkl runs the project's 0.2 / 2.5
    kl_coef = 0.2 * 0.01  # what preflight returns: init_kl_coef x score.scale
    filled = study.matched_settings(study.load_arms()["sparse_lowkl"], 0.025, kl_coef)
    assert filled["ppo.init_kl_coef"] == pytest.approx(0.08) and "score.scale" not in filled
    lowkl = {"rev": "c" * 40, "params": {"score": {"scale": 0.01}, "ppo": {"init_kl_coef": 0.08}}, "metrics": {}}
    assert study.scale_run_with({"sparse_lowkl-s0": lowkl}, [("sparse_lowkl", 0)], study.load_arms(),
                                kl_coef) == pytest.approx(0.025)


def test_interval_and_paired_difference_by_hand():
    assert t975(2) == 4.3027  # the printed table (pipeline/studies/analysis.py serves every study)
    # 0.2, 0.4, 0.6: mean 0.4, s = 0.2, half = 4.3027 * 0.2 / sqrt(3) = 0.49687
    ci = interval([0.2, 0.4, 0.6])
    assert ci["mean"] == pytest.approx(0.4) and ci["half"] == pytest.approx(0.4969, abs=1e-4)
    assert ci["low"] == pytest.approx(0.4 - 0.4969, abs=1e-4) and ci["n"] == 3
    assert interval([0.7])["half"] is None  # one seed: no interval, not a zero-width one
    # dense 0.5, 0.7, 0.4 against sparse 0.3, 0.4, 0.35: per-seed differences 0.2, 0.3, 0.05
    d = paired_difference({0: 0.5, 1: 0.7, 2: 0.4}, {2: 0.35, 0: 0.3, 1: 0.4})
    diffs = [0.2, 0.3, 0.05]
    s = math.sqrt(sum((x - 0.55 / 3) ** 2 for x in diffs) / 2)
    assert d["mean"] == pytest.approx(0.55 / 3) and d["half"] == pytest.approx(4.3027 * s / math.sqrt(3), abs=1e-4)
    # paired is narrower than the unpaired spread of either arm here: the seed effect cancels
    assert d["half"] < interval([0.5, 0.7, 0.4])["half"]
    with pytest.raises(ValueError, match="share no seed"):
        paired_difference({0: 1.0}, {1: 1.0})


def test_episodes_to_reach_by_hand():
    assert first_reaching([(0, 0.1), (64, 0.25), (128, 0.3)], 0.25) == 64
    assert first_reaching([(0, 0.1), (64, 0.2)], 0.25) is None
    assert seed_mean_points([[(0, 0.1), (64, 0.3)], [(0, 0.2), (64, 0.5)]]) == [(0, 0.15), (64, 0.4)]


def record(arm, seed, final, curve, *, kl=0.1, scale=1.0, requests=0, env=(0.2,), total=(0.2,)):
    return {"arm": arm, "seed": seed, "rev": "r", "scale": scale, "rollouts_per_round": 64,
            "eval": {"world/coverage": final, "world/env_reward_mean": final},
            "eval_curve": [{"round": r, "world/coverage": v} for r, v in enumerate(curve)], "kl_end": kl,
            "env_reward": list(env), "total_reward": list(total),
            "critic": {"critic_requests": requests, "cache_hits": 1, "critic_tokens": 10, "critic_cost_usd": 0.0}}


def test_report_numbers_by_hand(tmp_path):
    by_arm = {"sparse": [record("sparse", 0, 0.30, [0.1, 0.2, 0.3]), record("sparse", 1, 0.20, [0.1, 0.15, 0.2])],
              "dense": [record("dense", 0, 0.40, [0.1, 0.3, 0.4], requests=5),
                        record("dense", 1, 0.35, [0.1, 0.2, 0.35], requests=3)]}
    report = study_report.build_report(by_arm)
    assert report["metric"] == "world/coverage"
    assert report["target"] == pytest.approx(0.25)  # sparse's seed-mean curve at its last point: (0.3 + 0.2) / 2
    # dense's seed-mean curve: 0.1, 0.25, 0.375 -> round 1 reaches 0.25: 1 x 64 episodes; sparse at round 2
    assert report["arms"]["dense"]["episodes_to_target"] == 64
    assert report["arms"]["sparse"]["episodes_to_target"] == 128
    d = report["differences"]["dense-sparse"]["world/coverage"]  # per seed 0.10, 0.15
    # s = |0.15 - 0.10| / sqrt(2), so half = t(1) * s / sqrt(2) = 12.706 * 0.025
    assert d["mean"] == pytest.approx(0.125) and d["half"] == pytest.approx(12.706 * 0.025, abs=1e-4)
    assert report["arms"]["dense"]["critic"]["critic_requests"] == 8
    assert report["arms"]["dense"]["eval"]["world/coverage"]["mean"] == pytest.approx(0.375)
    text = study_report.markdown(report, "t")
    assert "| dense | 2 | 0.375 ± " in text and "| dense-sparse | 2 | +0.125 ± " in text
    assert "| dense | 8 | 2 | 20 | 0.0000 |" in text and "Not finished" not in text
    partial = study_report.markdown({**report, "missing": ["sparse-s2", "dense-s2"]}, "t")
    assert partial.rstrip().endswith("Not finished, so not in this report: sparse-s2, dense-s2.")
    png = study_report.plot_curves(by_arm, "world/coverage", tmp_path / "c.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_matched_scale_by_hand():
    dense = [record("dense", 0, 0, [], env=(0.2, 0.2), total=(0.6, 0.8)), record("dense", 1, 0, [], total=(1.0,))]
    sparse = [record("sparse", 0, 0, [], env=(0.2, 0.4), total=(0.2, 0.4))]
    assert study_report.matched_scale(dense, sparse) == pytest.approx(0.8 / 0.3)  # mean total 0.8 / mean env 0.3
    with pytest.raises(DataError, match="no positive scale"):
        study_report.matched_scale(dense, [record("sparse", 0, 0, [], env=(0.0,))])


def test_a_critic_that_subtracts_is_matched_by_spread_and_by_mean_is_told_to():
    # CommonGen's rule critic: dense's total reward is negative on average, so no k matches its mean
    dense = [record("dense", 0, 0, [], env=(0.1, 0.2), total=(-1.0, -0.8))]
    sparse = [record("sparse", 0, 0, [], env=(0.1, 0.2), total=(0.1, 0.2))]
    with pytest.raises(DataError, match="use --scale-match std"):
        study_report.matched_scale(dense, sparse)
    dense[0]["spread"] = [{"total_reward_std": 0.3}, {"total_reward_std": 0.4}]
    sparse[0]["spread"] = [{"env_reward_std": 0.1}, {"env_reward_std": 0.2}]
    # k = sqrt(mean within-round variance of dense's total / of sparse's env) = sqrt(0.125 / 0.025)
    assert study_report.matched_scale(dense, sparse, "std") == pytest.approx(math.sqrt(5))
    # drlc study's default, auto, takes std here and mean where both means are positive
    positive = [record("dense", 0, 0, [], env=(0.1, 0.2), total=(0.4, 0.2))]
    assert [study_report.match_method(d, sparse, "auto") for d in (dense, positive)] == ["std", "mean"]
    assert study_report.match_method(dense, sparse, "mean") == "mean"  # asked for: matched_scale says why it fails
    asked = []

    def refs_of(with_spread):  # what drlc study's collect gives: the spread only when asked
        asked.append(with_spread)
        strip = (lambda r: r) if with_spread else (lambda r: {k: v for k, v in r.items() if k != "spread"})
        return {"dense": [strip(r) for r in dense], "sparse": [strip(r) for r in sparse]}
    assert study_report.choose_scale(refs_of, "auto") == (pytest.approx(math.sqrt(5)), "std") and asked == [False, True]
    dense[:] = positive
    assert study_report.choose_scale(refs_of, "auto") == (pytest.approx(0.3 / 0.15), "mean") and asked[2:] == [False]


def test_final_eval_reads_the_trained_policy():
    metrics = {"base": {"world": {"coverage": 0.1}}, "round=0002": {"world": {"coverage": 0.4, "env_reward_mean": 0.8,
                                                                                "n_samples": 64}}}
    assert study_report.final_eval(metrics) == {"world/coverage": 0.4, "world/env_reward_mean": 0.8}


def test_kl_at_the_end_is_the_final_policys_where_measured_else_the_last_ppo_rounds():
    rounds = [{"kl": 0.5}, {"kl": 1.25}]
    assert study_report.end_kl({"world/coverage": 0.4, "world/kl_to_base": 2.0}, rounds) == (2.0, "eval")
    assert study_report.end_kl({"world/coverage": 0.4}, rounds) == (1.25, "ppo")  # evaluated before kl_to_base
    assert study_report.end_kl({}, []) == (None, None)
    by_arm = {"sparse": [dict(record("sparse", 0, 0.3, [0.1, 0.3], kl=1.25), kl_source="ppo")]}
    text = study_report.markdown(study_report.build_report(by_arm), "t")
    assert "the last PPO round's mean KL" in text and "kl_to_base on the eval prompts" not in text


def kl_record(arm, seed, kls, values):
    """A run whose eval curve carries kl_to_base (round 0, the base, at KL 0)."""
    run = record(arm, seed, values[-1], values, kl=kls[-1])
    run["eval_curve"] = [{"round": r, "world/coverage": v, "world/kl_to_base": k}
                         for r, (k, v) in enumerate(zip(kls, values))]
    return run


def test_matched_kl_by_hand():
    # seed 0: dense reaches KL 1.0, sparse_scaled 2.0; read both at 1.0: dense 0.5, sparse_scaled 0.2 (its round 1)
    # seed 1: dense ends at 0.8 (0.4); sparse_scaled at 0.8 lies between (0.4, 0.2) and (1.6, 0.5): 0.3
    by_arm = {"dense": [kl_record("dense", 0, [0, 0.5, 1.0], [0.1, 0.3, 0.5]),
                        kl_record("dense", 1, [0, 0.4, 0.8], [0.1, 0.2, 0.4])],
              "sparse_scaled": [kl_record("sparse_scaled", 0, [0, 1.0, 2.0], [0.1, 0.2, 0.6]),
                                kl_record("sparse_scaled", 1, [0, 0.4, 1.6], [0.1, 0.2, 0.5])]}
    report = study_report.build_report(by_arm)
    d = report["matched_kl"]["dense-sparse_scaled"]
    assert d["seeds"] == [0, 1] and d["mean"] == pytest.approx(0.2)  # per seed 0.3 and 0.1
    assert d["half"] == pytest.approx(12.7062 * math.sqrt(0.02) / math.sqrt(2))  # s of (0.3, 0.1), t(1)
    assert d["kl"]["mean"] == pytest.approx(0.9)
    end = report["differences"]["dense-sparse_scaled"]["world/coverage"]  # per seed -0.1 and -0.1: the other sign
    assert end["mean"] == pytest.approx(-0.1)
    text = study_report.markdown(report, "t")
    assert "| dense-sparse_scaled | 2 | 0.90 ± " in text and "| +0.200 ± " in text and "| -0.100 ± 0.000 |" in text
    front = report["arms"]["dense"]["frontier"]  # seed means per round: KL 0, 0.45, 0.9; coverage 0.1, 0.25, 0.45
    assert front["kl"] == pytest.approx([0, 0.45, 0.9]) and front["metric"] == pytest.approx([0.1, 0.25, 0.45])


def test_a_frontier_is_isotonic_and_never_read_past_either_runs_kl():
    # a coverage that falls with KL is pooled (0.4 and 0.3 -> 0.35), the frontier's "best for the KL spent"
    falling = kl_record("dense", 0, [0, 0.5, 1.0], [0.1, 0.4, 0.3])
    assert study_report.frontier(list(study_report.kl_curve(falling, "world/coverage").values())) == \
        ([0, 0.5, 1.0], pytest.approx([0.1, 0.35, 0.35]))
    flat = kl_record("sparse", 0, [0, 0.25, 0.5], [0.1, 0.2, 0.3])
    kl, gain = study_report.at_matched_kl(falling, flat, "world/coverage")
    assert kl == 0.5 and gain == pytest.approx(0.35 - 0.3)
    # an experiment evaluated before kl_to_base: no frontier, no matched-KL difference; the table says why
    old = record("sparse", 0, 0.3, [0.1, 0.3])
    assert study_report.at_matched_kl(falling, old, "world/coverage") is None
    report = study_report.build_report({"dense": [falling], "sparse": [old]})
    assert report["matched_kl"]["dense-sparse"] is None
    assert "| dense-sparse | - | - | no eval curve with kl_to_base and a point between the base and the end |" \
        in study_report.markdown(report, "t")
    # a run in one chunk is evaluated at the base and its end only: a straight line is no frontier
    two_points = kl_record("sparse", 0, [0, 0.5], [0.1, 0.3])
    assert study_report.frontier(list(study_report.kl_curve(two_points, "world/coverage").values())) is None
    assert study_report.at_matched_kl(falling, two_points, "world/coverage") is None


def toxicity_record(arm, seed, kls, values):
    """kl_record with the metric world/expected_max_toxicity, where lower is better."""
    run = kl_record(arm, seed, kls, values)
    for point in run["eval_curve"]:
        point["world/expected_max_toxicity"] = point.pop("world/coverage")
    run["eval"] = {"world/expected_max_toxicity": values[-1]}
    return run


def test_a_metric_where_lower_is_better_has_a_falling_frontier_target_and_best_control():
    metric = "world/expected_max_toxicity"
    assert study_report.better(metric) == -1 and study_report.better("world/coverage") == 1
    # toxicity 0.5 -> 0.3 -> 0.35 over KL 0, 0.5, 1: the best for the KL spent never rises, so the fit keeps 0.5
    # and pools the rise 0.3, 0.35 to 0.325
    dense = toxicity_record("dense", 0, [0, 0.5, 1.0], [0.5, 0.3, 0.35])
    assert study_report.frontier(list(study_report.kl_curve(dense, metric).values()), -1) == \
        ([0, 0.5, 1.0], pytest.approx([0.5, 0.325, 0.325]))
    sparse = toxicity_record("sparse", 0, [0, 0.5, 1.0], [0.5, 0.45, 0.40])
    kl, gain = study_report.at_matched_kl(dense, sparse, metric)
    assert kl == 1.0 and gain == pytest.approx(0.325 - 0.40)  # dense is less toxic at the same KL
    report = study_report.build_report({"sparse": [sparse], "dense": [dense],
                                        "sparse_scaled": [toxicity_record("sparse_scaled", 0, [0, 0.5, 1.0],
                                                                          [0.5, 0.42, 0.38])],
                                        "sparse_lowkl": [toxicity_record("sparse_lowkl", 0, [0, 0.5, 1.0],
                                                                         [0.5, 0.48, 0.44])]}, metric=metric)
    # the target is sparse's last point, 0.40: dense reaches it first at round 1 (0.3 <= 0.40), x 64 rollouts
    assert report["target"] == 0.40 and report["arms"]["dense"]["episodes_to_target"] == 64
    assert report["arms"]["sparse_lowkl"]["episodes_to_target"] is None  # 0.44 never gets down to 0.40
    assert study_report.best_control(report) == "sparse_scaled"  # 0.38 is better than 0.44
    row = study_report.versus_best_control(report)
    # dense - sparse_scaled at KL 1: 0.325 - 0.38 = -0.055, a gain of 5.5 points; 0 critic requests per point
    assert row["at_kl"]["mean"] == pytest.approx(-0.055) and row["critic_per_point"]["critic_requests"] == 0
    assert "**world/expected_max_toxicity** (lower is better)" in study_report.markdown(report, "t")


def test_the_frontier_rows_are_what_dvc_plots_draws(tmp_path):
    rows = study_report.frontier_rows({"dense": [kl_record("dense", 3, [0, 0.5], [0.1, 0.3])]}, "world/coverage")
    assert rows == [{"arm": "dense", "seed": 3, "round": 0, "kl_to_base": 0, "world/coverage": 0.1},
                    {"arm": "dense", "seed": 3, "round": 1, "kl_to_base": 0.5, "world/coverage": 0.3}]
    by_arm = {"dense": [kl_record("dense", 0, [0, 0.5, 1.0], [0.1, 0.3, 0.5])]}
    png = study_report.plot_curves(by_arm, "world/coverage", tmp_path / "c.png", study_report.build_report(by_arm))
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.fixture
def bare_project(tmp_path, monkeypatch):
    """A committed git repo holding the demo's params.yaml, in a home with no git identity (a new user's)."""
    for name in ("HOME", "XDG_CONFIG_HOME"):
        monkeypatch.setenv(name, str(tmp_path / "home"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for who in ("AUTHOR", "COMMITTER"):
        for part in ("NAME", "EMAIL"):
            monkeypatch.delenv(f"GIT_{who}_{part}", raising=False)
    project = tmp_path / "project"
    project.mkdir()
    (project / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    import subprocess

    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    subprocess.run(["git", "add", "params.yaml"], cwd=project, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@x", "commit", "-qm", "p"], cwd=project, check=True)
    study.git_identity.cache_clear()
    yield project
    study.git_identity.cache_clear()


@pytest.mark.slow  # git, a few seconds
def test_with_no_git_identity_drlc_signs_only_its_experiment_commits(bare_project, capsys):
    import subprocess

    assert study.git_identity(bare_project) == study.IDENTITY
    assert study.dvc_env(bare_project)["GIT_COMMITTER_EMAIL"] == "drlc-study@localhost"
    arms = study.pick_arms(study.load_arms(), ["sparse", "dense", "sparse_scaled"])
    assert study.preflight(bare_project, arms, []) == pytest.approx(0.2)  # the demo's KL coefficient x scale 1
    assert study.preflight(bare_project, arms, ["score.scale=0.01"]) == pytest.approx(0.002)
    assert "signed 'drlc study <drlc-study@localhost>'" in capsys.readouterr().out
    unset = subprocess.run(["git", "config", "--get", "user.name"], cwd=bare_project, capture_output=True)
    assert unset.returncode != 0  # the user's git config is not written
    subprocess.run(["git", "config", "user.name", "Ann"], cwd=bare_project, check=True)
    subprocess.run(["git", "config", "user.email", "ann@x"], cwd=bare_project, check=True)
    study.git_identity.cache_clear()
    assert study.git_identity(bare_project) == {}  # a user with an identity signs their own


@pytest.mark.slow  # git, a few seconds
def test_what_the_second_phase_needs_is_checked_before_the_first_runs(bare_project, tmp_path):
    arms_file = tmp_path / "arms.yaml"
    arms_file.write_text("sparse: {critic.enabled: false}\ndense: {critic.enabled: true}\n"
                         "sparse_scaled: {critic.enabled: false, score.scale: matched, ppo.init_kl: 0.1}\n")
    arms = study.pick_arms(study.load_arms(arms_file), ["sparse", "dense", "sparse_scaled"])
    with pytest.raises(ConfigError, match=r"arm 'sparse_scaled' on .*params.yaml: .*'ppo.init_kl'"):
        study.study(bare_project, arms=arms, seeds=[0])  # fails at once: no experiment is queued
    lowkl = study.pick_arms(study.load_arms(), ["sparse", "dense", "sparse_lowkl"])
    with pytest.raises(ConfigError, match=r"ppo.init_kl_coef = 0.0 .*sparse_lowkl divides it by k"):
        study.preflight(bare_project, lowkl, ["ppo.init_kl_coef=0.0"])
    (tmp_path / "plain").mkdir()
    with pytest.raises(DataError, match="not a git repository with a commit"):
        study.preflight(tmp_path / "plain", arms, [])
