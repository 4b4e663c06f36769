"""The real-text study (issue 30): its arms' params (valid on the study profile, parsed by Hydra as DVC does),
its dry-run plan, and its report numbers recomputed by hand on tiny synthetic runs."""
import json
import math
import shutil
import sys
from pathlib import Path

import pytest

from benchmarks import sample_efficiency_dvc as se
from pipeline.commands import study
from pipeline.core.config import load_params
from pipeline.core.errors import ConfigError, DataError
from pipeline.studies import analysis, critics, real_text
from pipeline.studies.critics import ALL

ROOT = Path(__file__).resolve().parents[1]

PROFILE = ROOT / "configs" / "study-detox.yaml"
EVERY_ARM = critics.study_arms(list(critics.CRITICS), list(critics.ALGORITHMS))


def test_each_critic_arm_sets_its_critic_and_the_controls_set_none():
    tagger = critics.settings("dense_tagger", seed=0)
    assert tagger["critic.backend"] == "tagger" and tagger["critic.model_dir"] == "critics/semeval"
    assert tagger["critic.threshold"] == ALL and tagger["score.scale"] == 1.0 and tagger["critic.extra_body"] == {}
    assert critics.settings("dense_random", seed=2)["critic.extra_body"] == {"drlc_seed": 2}
    assert critics.settings("dense_random", seed=2)["critic.backend"] == "random_spans"
    assert critics.settings("dense_smol_copy", seed=0)["critic.answer_format"] == "copy"
    assert critics.settings("dense_smol_text", seed=0)["critic.model_dir"] == "base"
    assert critics.settings("sparse_scaled", seed=0, k=2.5)["score.scale"] == 2.5
    assert critics.settings("sparse", seed=1)["critic.enabled"] is False
    grpo = critics.settings("dense_tagger-grpo", seed=0)
    assert grpo["ppo.algorithm"] == "grpo" and grpo["rollout.samples_per_prompt"] == 4 and grpo["ppo.vf_coef"] == 0.0
    with pytest.raises(ConfigError, match="normalises the env reward per group"):
        critics.settings("sparse_scaled-grpo", seed=0, k=2.0)
    with pytest.raises(ConfigError, match="needs k"):
        critics.settings("sparse_scaled", seed=0)
    with pytest.raises(ConfigError, match="unknown real-text arm 'dense_gpt'"):
        critics.settings("dense_gpt", seed=0)
    assert critics.study_arms(["tagger", "random"], ["ppo"]) == ["sparse", "dense_tagger", "dense_random",
                                                                  "sparse_scaled"]
    assert critics.study_arms(["tagger"], ["grpo"]) == ["sparse-grpo", "dense_tagger-grpo"]
    assert critics.study_arms(["tagger", "lexicon"], ["ppo", "grpo"], ["tagger"]) == [
        "sparse", "dense_tagger", "dense_lexicon", "sparse-grpo", "dense_tagger-grpo", "sparse_scaled"]
    with pytest.raises(ConfigError, match="unknown critics"):
        critics.study_arms(["tagger"], ["grpo"], ["gpt"])
    assert [critics.control(a) for a in ("sparse", "dense_random", "sparse-grpo", "dense_tagger-rloo")] == [
        "sparse_scaled", "sparse_scaled", "sparse-grpo", "sparse-rloo"]


def test_every_arm_is_valid_on_the_study_profile_through_hydras_override_parser(tmp_path):
    from dvc.utils.hydra import apply_overrides
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for arm in EVERY_ARM:
        for seed in (0, 3):
            settings = critics.settings(arm, seed=seed, k=1.7)
            command = se.run_command(arm, seed, settings, [], runner="queue")
            overrides = [command[i + 1] for i, part in enumerate(command) if part == "-S"]
            parsed = {o.key_or_group: o.value() for o in map(parser.parse_override, overrides)}
            assert parsed == {"run.seed": seed, **settings}  # what DVC writes into params.yaml
            applied = tmp_path / f"{arm}-{seed}.yaml"  # as `dvc exp run -S` applies them (struct mode)
            shutil.copy(PROFILE, applied)
            apply_overrides(str(applied), overrides)
            params = load_params(applied)  # every key exists and the whole profile validates
            assert params.critic.backend == settings.get("critic.backend", params.critic.backend)
            assert params.ppo.algorithm == settings["ppo.algorithm"]


def test_dry_run_plans_sparse_the_critics_then_sparse_scaled_matched_to_the_tagger(tmp_path, capsys):
    shutil.copy(PROFILE, tmp_path / "params.yaml")
    assert se.main(["--project", str(tmp_path), "--critics", "random", "--seeds", "0", "1", "--dry-run"]) is None
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("$ dvc exp run -")
             and " -n " in line]
    names = [line.split(" -n ")[1].split()[0] for line in lines]
    assert names == ["sparse-s0", "sparse-s1", "dense_random-s0", "dense_random-s1", "dense_tagger-s0",
                     "dense_tagger-s1", "sparse_scaled-s0", "sparse_scaled-s1"]
    assert "-S '++critic.extra_body={drlc_seed: 1}'" in lines[3]
    assert "-S 'score.scale=\"<k>\"'" in lines[-1]


def test_paired_interval_by_hand():
    got = real_text.paired_interval({0: 1.0, 1: 2.0, 2: 3.0, 5: 9.0}, {0: 0.5, 1: 1.0, 2: 1.5})
    half = 4.302653 * 0.5 / math.sqrt(3)  # diffs 0.5, 1, 1.5: sd 0.5; t(0.975, 2) = 4.3027
    assert got["n"] == 3 and got["mean"] == pytest.approx(1.0)
    assert got["low"] == pytest.approx(1.0 - half, abs=1e-4) and got["high"] == pytest.approx(1.0 + half, abs=1e-4)
    one = real_text.paired_interval({0: 2.0}, {0: 0.5})
    assert (one["mean"], one["low"], one["high"], one["n"]) == (1.5, None, None, 1)
    assert real_text.paired_interval({1: 2.0}, {0: 0.5})["mean"] is None


# t(0.975, df) to 4 decimals, as printed in any statistics table (scipy is not a drlc dependency, so CI lacks it)
PRINTED_T_975 = {1: 12.7062, 2: 4.3027, 5: 2.5706, 10: 2.2281, 11: 2.2010, 20: 2.0860, 60: 2.0003}


def test_the_one_t_quantile_matches_the_printed_table():
    """pipeline/studies/analysis.py t975 serves every study (scipy is not a drlc dependency, so CI lacks it)."""
    for df, printed in PRINTED_T_975.items():
        assert analysis.t975(df) == pytest.approx(printed, abs=1e-3)


def _run(seed, rewards, kls, *, tox, tokens=(0, 0)):
    rounds = [{"round": i + 1, "env_reward": r, "kl": k, "critic_prompt_tokens": tokens[0],
               "critic_completion_tokens": tokens[1], "critic_cost_usd": 0.0, "critic_requests": 4, "cache_hits": 0}
              for i, (r, k) in enumerate(zip(rewards, kls))]
    return {"seed": seed, "rounds": rounds, "eval": {"world/expected_max_toxicity": tox, "world/dist_2": 0.5}}


def test_arm_rows_by_hand():
    kls = [0.0, 1.0, 2.0, 3.0]
    by_arm = {
        "sparse": [_run(s, [0.50, 0.55, 0.60, 0.65], kls, tox=0.6) for s in (0, 1)],
        "sparse_scaled": [_run(s, [0.50, 0.56, 0.61, 0.66], kls, tox=0.6 - 0.01 * s) for s in (0, 1)],
        # the same KL at every round, reward 0.04 above sparse_scaled: the matched-KL gain is exactly 0.04
        "dense_tagger": [_run(s, [0.54, 0.60, 0.65, 0.70], kls, tox=0.5 - 0.03 * s, tokens=(1000, 100))
                         for s in (0, 1)],
    }
    rows = real_text.arm_rows(by_arm, {"tagger": {"char_f1": 0.655}}, final_window=2, batch_size=16)
    tagger = rows["dense_tagger"]
    assert tagger["critic"] == "tagger" and tagger["char_f1"] == 0.655 and rows["sparse"]["char_f1"] is None
    assert tagger["gain_at_matched_kl"] == pytest.approx(0.04)
    # sparse's final reward = mean(0.60, 0.65) = 0.625; tagger's curve first reaches it at round 3 (0.65)
    assert tagger["rollouts_to_sparse_final"] == 3 * 16 and rows["sparse"]["rollouts_to_sparse_final"] == 4 * 16
    assert tagger["final_env_reward_vs_control"]["mean"] == pytest.approx(0.675 - 0.635)
    tox = tagger["eval_vs_control"]["world/expected_max_toxicity"]  # diffs -0.1 and -0.12
    assert tox["mean"] == pytest.approx(-0.11) and tox["n"] == 2
    assert tox["high"] - tox["mean"] == pytest.approx(12.7062 * 0.01, rel=1e-3)  # sd 0.01 x sqrt 2, / sqrt 2
    cost = tagger["critic_cost"]  # 2 seeds x 4 rounds x (1000, 100) tokens at $0.5 / $1.5 per 1M
    assert cost["prompt_tokens"] == 8000 and cost["completion_tokens"] == 800
    assert cost["at_api_prices_usd"] == pytest.approx(8000 * 0.5e-6 + 800 * 1.5e-6) and cost["paid_usd"] == 0.0
    assert cost["requests"] == 32
    table = real_text.markdown(rows)
    assert "| dense_tagger | 0.655 | 0,1 | 48 | sparse_scaled | +0.040 |" in table


def test_value_free_arms_are_measured_against_their_own_sparse_arm():
    kls = [0.0, 1.0, 2.0]
    by_arm = {
        "sparse": [_run(s, [0.5, 0.6, 0.7], kls, tox=0.6) for s in (0, 1)],
        "sparse_scaled": [_run(s, [0.5, 0.5, 0.5], kls, tox=0.6) for s in (0, 1)],
        # GRPO's sparse arm: final 0.64; its KL levels 0, 0.5, 1
        "sparse-grpo": [_run(s, [0.50, 0.60, 0.64 + 0.02 * s], [0.0, 0.5, 1.0], tox=0.60) for s in (0, 1)],
        # reward 0.03 above sparse-grpo at the same KL in every round, and 0.05 less toxic
        "dense_tagger-grpo": [_run(s, [0.53, 0.63, 0.67 + 0.02 * s], [0.0, 0.5, 1.0], tox=0.55) for s in (0, 1)],
    }
    rows = real_text.arm_rows(by_arm, {"tagger": {"char_f1": 0.6}}, final_window=1, batch_size=16)
    grpo = rows["dense_tagger-grpo"]
    assert grpo["control"] == "sparse-grpo" and grpo["algorithm"] == "grpo" and rows["sparse"]["control"] == \
        "sparse_scaled"
    assert grpo["final_env_reward_vs_control"]["mean"] == pytest.approx(0.03)  # not vs sparse_scaled's 0.5
    assert grpo["final_env_reward_vs_control"]["high"] == pytest.approx(0.03)  # the same gain at both seeds
    assert grpo["gain_at_matched_kl"] == pytest.approx(0.03) and grpo["gain_at_matched_kl_vs_sparse"] == \
        pytest.approx(0.03)
    assert grpo["eval_vs_control"]["world/expected_max_toxicity"]["mean"] == pytest.approx(-0.05)
    # GRPO's target is sparse-grpo's final (seed mean 0.65), first reached by dense_tagger-grpo at round 3
    assert grpo["rollouts_to_sparse_final"] == 3 * 16 and rows["dense_tagger-grpo"]["char_f1"] == 0.6
    assert "| dense_tagger-grpo | 0.600 | 0,1 | 48 | sparse-grpo | +0.030 |" in real_text.markdown(rows)
    assert "vs_random" not in grpo  # no dense_random-grpo arm to compare with
    with pytest.raises(DataError, match="measured against sparse-grpo, which is not among the runs"):
        real_text.arm_rows({arm: by_arm[arm] for arm in ("sparse", "dense_tagger-grpo")}, {}, final_window=1,
                           batch_size=16)


def test_each_critic_is_compared_with_the_random_control_of_its_own_algorithm():
    kls = [0.0, 1.0]
    by_arm = {
        "sparse": [_run(s, [0.5, 0.6], kls, tox=0.6) for s in (0, 1)],
        "dense_random": [_run(s, [0.5, 0.61 + 0.01 * s], kls, tox=0.50) for s in (0, 1)],
        "dense_tagger": [_run(s, [0.5, 0.64 + 0.03 * s], kls, tox=0.45 + 0.02 * s) for s in (0, 1)],
        "sparse-grpo": [_run(s, [0.5, 0.7], kls, tox=0.6) for s in (0, 1)],
        "dense_random-grpo": [_run(s, [0.5, 0.69], kls, tox=0.40) for s in (0, 1)],
        "dense_tagger-grpo": [_run(s, [0.5, 0.68], kls, tox=0.41) for s in (0, 1)],
    }
    rows = real_text.arm_rows(by_arm, {}, final_window=1, batch_size=16)
    tagger, grpo = rows["dense_tagger"]["vs_random"], rows["dense_tagger-grpo"]["vs_random"]
    assert tagger["arm"] == "dense_random" and grpo["arm"] == "dense_random-grpo"
    # seed diffs 0.03 and 0.05: mean 0.04, sd 0.01 sqrt 2, half width t(1) x 0.01
    assert tagger["final_env_reward"]["mean"] == pytest.approx(0.04)
    assert tagger["final_env_reward"]["high"] - 0.04 == pytest.approx(12.7062 * 0.01, rel=1e-3)
    assert tagger["eval"]["world/expected_max_toxicity"]["mean"] == pytest.approx(-0.04)
    assert grpo["final_env_reward"]["mean"] == pytest.approx(-0.01)
    assert grpo["eval"]["world/expected_max_toxicity"]["mean"] == pytest.approx(0.01)
    assert "vs_random" not in rows["dense_random"] and "vs_random" not in rows["sparse"]
    table = real_text.random_markdown(rows)
    assert "| dense_tagger-grpo | dense_random-grpo | 0,1 | -0.010 [-0.010, -0.010] | +0.010 [+0.010, +0.010] |" in table
    assert real_text.random_markdown({"sparse": rows["sparse"]}) == ""


def test_dry_run_gives_the_best_critic_and_the_random_control_main_seeds_under_every_algorithm(tmp_path, capsys):
    shutil.copy(PROFILE, tmp_path / "params.yaml")
    se.main(["--project", str(tmp_path), "--critics", "tagger", "lexicon", "random", "--algorithms", "ppo", "grpo",
             "--value-free-critics", "random", "--seeds", "0", "--main-seeds", "0", "1", "--dry-run"])
    names = [line.split(" -n ")[1].split()[0] for line in capsys.readouterr().out.splitlines()
             if line.startswith("$ dvc exp run -") and " -n " in line]
    assert names == ["sparse-s0", "sparse-s1", "dense_tagger-s0", "dense_tagger-s1", "dense_lexicon-s0",
                     "dense_random-s0", "dense_random-s1", "sparse-grpo-s0", "sparse-grpo-s1",
                     "dense_random-grpo-s0", "dense_random-grpo-s1", "sparse_scaled-s0", "sparse_scaled-s1"]


def test_gain_vs_f1_plot_is_written(tmp_path):
    kls = [0.0, 1.0]
    by_arm = {arm: [_run(s, [0.5, 0.6 + 0.01 * i], kls, tox=0.5) for s in (0, 1)]
              for i, arm in enumerate(("sparse", "sparse_scaled", "dense_tagger", "dense_random"))}
    rows = real_text.arm_rows(by_arm, {"tagger": {"char_f1": 0.65}, "random": {"char_f1": 0.05}}, final_window=1,
                              batch_size=16)
    path = real_text.plot_gain_vs_f1(rows, tmp_path / "gain.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
    curves = real_text.plot_learning_curves(by_arm, target=0.6, batch_size=16, path=tmp_path / "curves.png")
    assert curves.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and curves.stat().st_size > 5000


def test_study_critics_reads_smollm2_quality_from_the_committed_formats_result():
    from benchmarks.study_critics import smollm2_quality

    quality = smollm2_quality(ROOT / "benchmarks" / "results" / "critic_formats.json")
    rows = json.loads((ROOT / "benchmarks" / "results" / "critic_formats.json").read_text())["results"]
    hf = {r["answer_format"]: r for r in rows if r.get("endpoint", "hf") == "hf" and r["samples"] == 1}
    assert quality["smol_copy"]["char_f1"] == hf["copy"]["char_f1"]
    assert quality["smol_text"]["n_posts"] == hf["text"]["n_posts"]
    llamacpp = [r["char_f1"] for r in rows if r.get("endpoint") == "llamacpp" and r["answer_format"] == "copy"]
    assert llamacpp and quality["smol_copy"]["char_f1"] not in llamacpp  # the study's critic is drlc's hf one


def test_an_experiment_killed_mid_run_is_not_counted_as_done():
    # the shape `dvc exp show --json` (DVC 3) gave in the study clone after a `dvc exp run --temp` was killed:
    # the killed one keeps a run-folder rev and data rev "workspace"; a finished one has its commit in both
    done, killed = "45bf3ed6062167b2dc6c47844341dd5556a7c9fd", "5ece2e1a7f94d24dd6c791be43bd6a0c66dd2732"
    data = {"params": {"params.yaml": {"data": {"run": {"seed": 0}}}},
            "metrics": {"metrics/eval.json": {"data": {"coverage": 0.31}}}}
    shown = [{"rev": "workspace", "experiments": None},
             {"rev": "c220875", "experiments": [
                 {"name": "sparse-grpo-s0", "revs": [{"rev": killed, "data": {**data, "rev": "workspace"}}]},
                 {"name": "sparse-s0", "revs": [{"rev": done, "data": {**data, "rev": done}}]},
                 # queued: a full rev but no metrics yet; failed: an error beside its full rev
                 {"name": "dense-s0", "revs": [{"rev": "a" * 40, "data": {**data, "rev": "a" * 40, "metrics": {}}}]},
                 {"name": "summed-s0", "revs": [{"rev": "b" * 40, "error": {"type": "killed"},
                                                 "data": {**data, "rev": "b" * 40}}]}]}]
    found = study.finished_experiments(shown)
    assert list(found) == ["sparse-s0"] and found["sparse-s0"]["rev"] == done
    assert found["sparse-s0"]["params"] == {"run": {"seed": 0}}


@pytest.mark.slow  # three DVC experiments of one round each on the shrunken toxicity demo (~3 min on 2 cores)
def test_real_text_arms_run_as_dvc_experiments_and_report(tmp_path, monkeypatch):
    import subprocess

    from e2e import experiment_project, tiny_params

    project = experiment_project(tmp_path, tiny_params(n_rounds=1, task="toxicity"), monkeypatch)
    quality = tmp_path / "quality.json"
    quality.write_text(json.dumps({"critics": {"lexicon": {"char_f1": 0.46}}}))
    out = tmp_path / "study.json"
    argv = ["--project", str(project), "--critics", "lexicon", "--scale-reference", "dense_lexicon", "--seeds", "0",
            "--runner", "temp", "--critic-quality", str(quality), "--out", str(out)]
    assert se.main(argv + ["--max-new", "1"]) is None and not out.exists()  # one piece: sparse-s0 only
    first = se.existing(project)
    assert list(first) == ["sparse-s0"]
    result = se.main(argv)  # the same command goes on where it stopped
    assert set(result["runs"]) == {"sparse", "dense_lexicon", "sparse_scaled"}
    assert result["runs"]["sparse"][0]["rev"] == first["sparse-s0"]["rev"]  # collected, not run again
    section = json.loads(out.read_text())["real_text"]
    lexicon = section["arms"]["dense_lexicon"]
    assert lexicon["char_f1"] == 0.46 and lexicon["seeds"] == [0]
    # the tokens the critic read, recounted from the experiment's annotations table
    import io

    import dvc.api
    import pyarrow.parquet as pq

    rev = result["runs"]["dense_lexicon"][0]["rev"]
    with dvc.api.open("data/annotations/round=0001/part-0.parquet", repo=str(project), rev=rev, mode="rb") as f:
        notes = pq.read_table(io.BytesIO(f.read())).to_pylist()
    assert lexicon["critic_cost"]["prompt_tokens"] == sum(n["prompt_tokens"] for n in notes) > 0
    assert lexicon["critic_cost"]["paid_usd"] == 0.0 and section["arms"]["sparse"]["critic_cost"]["prompt_tokens"] == 0
    gain = lexicon["final_env_reward_vs_control"]
    final = {arm: result["runs"][arm][0]["rounds"][-1]["env_reward"] for arm in ("dense_lexicon", "sparse_scaled")}
    assert gain["n"] == 1 and gain["low"] is None
    assert gain["mean"] == pytest.approx(final["dense_lexicon"] - final["sparse_scaled"])
    samples = section["samples"]["dense_lexicon"]
    assert len(samples) == 5 and all(isinstance(s["base"], str) and isinstance(s["final"], str) for s in samples)
    assert (out.parent / section["plot"]).stat().st_size > 0 and "| dense_lexicon | 0.460 | 0 |" in section["table"]
    shown = subprocess.run([sys.executable, "-m", "dvc", "exp", "show", "--json"], cwd=project, capture_output=True,
                           text=True, check=True).stdout
    params = {e["name"]: e["revs"][0]["data"]["params"]["params.yaml"]["data"]
              for c in json.loads(shown) for e in c.get("experiments") or []}
    assert params["dense_lexicon-s0"]["critic"]["backend"] == "lexicon"
    assert params["sparse_scaled-s0"]["score"]["scale"] == pytest.approx(result["scale_factor"]["k"])


def test_the_results_page_leads_with_the_committed_real_text_result():
    """docs/results.md's real-text block is benchmarks/results/study_real_text.json rendered again from its raw
    runs: a hand edit of the JSON's report, its runs, or the page fails here."""
    committed = json.loads((ROOT / "benchmarks/results/study_real_text.json").read_text())
    page = (ROOT / "docs" / "results.md").read_text()
    section = page.split(real_text.BLOCK_START, 1)[1].split(real_text.BLOCK_END, 1)[0]
    assert section.strip() == real_text.results_block(committed).strip()
    help_section = page.split("## Does the critic help?", 1)[1]
    assert help_section.index(real_text.BLOCK_START) < help_section.index("<!-- sentiment-study:start -->")



def test_rounds_overrides():
    assert se.rounds_overrides(None) == []
    assert se.rounds_overrides(2) == ["~rounds", "+rounds={0001: {prev: base}, 0002: {prev: 'round=0001'}}",
                                      "~chunks", "+chunks={}", "run.rounds_per_stage=1",
                                      "evaluate.policy='round=0002'"]
    assert se.rounds_overrides(8, 4)[2:5] == ["~chunks", "+chunks={0001: {prev: base, last: '0004'}, "
                                              "0005: {prev: 'round=0004', last: '0008'}}", "run.rounds_per_stage=4"]
    with pytest.raises(ConfigError, match="--per-stage 4 needs --rounds N"):
        se.rounds_overrides(None, 4)
