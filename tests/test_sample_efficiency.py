"""The sample-efficiency study (benchmarks/sample_efficiency.py) on a tiny smoke configuration of every task.

One module-scoped run of the whole study per task (base pretraining, seven arms x 2 seeds x 3
rounds, the replay ablation, plots and Markdown) feeds every test; each derived number is
recomputed here with numpy from the raw per-round records, independently of
pipeline/studies. The worlds' own measures are checked by hand.
"""
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.sample_efficiency import main, recompute_headlines, write_outputs
from pipeline.core.errors import DataError
from pipeline.studies.analysis import interpolate_at, isotonic_frontier, steps_to_reach
from pipeline.studies.config import TASKS, preset
from pipeline.studies.report import BLOCK_END, BLOCK_START, splice_doc
from pipeline.studies.study import run_study

ROOT = Path(__file__).resolve().parents[1]

PPO_ARMS = {"sparse", "sparse_scaled", "dense_all", "dense_selective", "dense_zero_mean"}
GRPO_ARMS = {"grpo_sparse", "grpo_dense"}
ARMS = PPO_ARMS | GRPO_ARMS


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """(study loaded back from the written JSON, output paths and the scratch folder, {task: config}) of one smoke
    study per task."""
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("study")
    configs = {task: preset("smoke", task) for task in TASKS}
    results = {task: run_study(config, scratch=tmp / "scratch", progress=False) for task, config in configs.items()}
    paths = write_outputs({"study": "sample_efficiency", "preset": "smoke", "tasks": results}, tmp / "results")
    return json.loads(paths["json"].read_text()), {**paths, "scratch": tmp / "scratch"}, configs


def _seed_mean(runs, key):
    return np.array([[r[key] for r in run["rounds"]] for run in runs]).mean(axis=0)


def _each_task(study):
    loaded, _, configs = study
    return [(task, loaded["tasks"][task], configs[task]) for task in TASKS]


@pytest.mark.slow  # the study fixture pretrains and trains every task's arms
def test_json_is_keyed_by_task_with_every_arm_seed_round_and_a_wall_time(study):
    loaded, paths, _ = study
    assert set(loaded["tasks"]) == set(TASKS)
    for task, result, config in _each_task(study):
        assert result["task"] == task and set(result["arms"]) == ARMS
        assert loaded["wall_seconds"][task] == result["wall_seconds"] > 0
        for data in result["arms"].values():
            assert [run["seed"] for run in data["runs"]] == list(config.seeds)
            for run in data["runs"]:
                assert [r["round"] for r in run["rounds"]] == list(range(1, config.rounds + 1))
                assert [r["rollouts"] for r in run["rounds"]] == [i * config.batch_size for i in range(1, config.rounds + 1)]
                assert all(0.0 <= r["env_reward"] <= 1.0 and math.isfinite(r["kl"]) for r in run["rounds"])
        for image in result["images"].values():
            assert task in image and (paths["json"].parent / image).stat().st_size > 1000
    eval_keys = {"sentiment": "positive_percent", "toxicity": "expected_max_toxicity", "summarization": "rouge1"}
    for task, result, _ in _each_task(study):
        assert eval_keys[task] in result["arms"]["sparse"]["runs"][0]["eval"]


@pytest.mark.slow  # the study fixture pretrains and trains every task's arms
def test_arm_rewards_are_what_each_arm_promises(study):
    for task, result, config in _each_task(study):
        k = result["scale_factor"]["k"]
        assert result["arms"]["sparse_scaled"]["spec"]["env_scale"] == pytest.approx(k)
        for arm, factor in (("sparse", 1.0), ("sparse_scaled", k), ("dense_zero_mean", 1.0)):
            for run in result["arms"][arm]["runs"]:
                for r in run["rounds"]:  # no net intrinsic reward: total = scale x env
                    assert r["total_reward"] == pytest.approx(factor * r["env_reward"], abs=1e-6), (task, arm)
        for run in result["arms"]["dense_all"]["runs"]:
            assert all(r["critiqued"] == config.batch_size for r in run["rounds"])
            if task != "sentiment":  # penalty-only critics: a critiqued response never gains reward
                assert all(r["total_reward"] <= r["env_reward"] + 1e-9 for r in run["rounds"])
        for arm in ("sparse", "grpo_sparse"):
            for run in result["arms"][arm]["runs"]:
                assert all(r["critiqued"] == 0 and r["total_reward"] == r["env_reward"] for r in run["rounds"])
        for run in result["arms"]["grpo_dense"]["runs"]:
            assert all(r["critiqued"] == config.batch_size for r in run["rounds"])
        assert result["arms"]["grpo_dense"]["spec"] == {
            "critic": True, "threshold": "all", "env_scale": 1.0, "zero_mean": False, "algorithm": "grpo",
            "samples_per_prompt": 4, "dense_weight": 1.0}
        for i in range(len(config.seeds)):  # round 1 samples the base policy with the same seed in every arm
            for arms in (PPO_ARMS, GRPO_ARMS):  # of the same update (GRPO: batch / 4 prompts x 4)
                assert len({result["arms"][a]["runs"][i]["rounds"][0]["env_reward"] for a in arms}) == 1


@pytest.mark.slow  # the study fixture pretrains and trains every task's arms
def test_scale_factor_matches_an_independent_computation(study):
    for task, result, config in _each_task(study):
        dense_rounds = [r for run in result["arms"]["dense_all"]["runs"] for r in run["rounds"]]
        sparse_rounds = [r for run in result["arms"]["sparse"]["runs"] for r in run["rounds"]]
        by_mean = np.mean([r["total_reward"] for r in dense_rounds]) / np.mean([r["env_reward"] for r in sparse_rounds])
        by_std = np.sqrt(np.mean([r["total_reward_std"] ** 2 for r in dense_rounds])
                         / np.mean([r["env_reward_std"] ** 2 for r in sparse_rounds]))
        expected = by_std if config.scale_match == "std" else by_mean
        assert result["scale_factor"]["k"] == pytest.approx(expected, rel=1e-9), task
        assert result["scale_factor"]["k_mean"] == pytest.approx(by_mean, rel=1e-9)
    assert preset("smoke", "toxicity").scale_match == preset("smoke", "summarization").scale_match == "std"


@pytest.mark.slow  # the study fixture pretrains and trains every task's arms
def test_steps_to_target_match_an_independent_computation(study):
    for task, result, config in _each_task(study):
        target = _seed_mean(result["arms"]["sparse"]["runs"], "env_reward")[-config.final_window:].mean()
        assert result["headline"]["sparse_target"] == pytest.approx(target, rel=1e-9)
        for arm in ARMS:
            curve = _seed_mean(result["arms"][arm]["runs"], "env_reward")
            hits = np.nonzero(curve >= target)[0]
            expected = int(hits[0]) + 1 if len(hits) else None
            got = result["headline"]["steps_to_target"][arm]
            assert got["rounds"] == expected, (task, arm)
            assert got["rollouts"] == (None if expected is None else expected * config.batch_size)


def _isotonic_by_minmax(y):
    """Isotonic regression by its min-max formula: fit_i = max_{j<=i} min_{k>=i} mean(y[j..k])."""
    n = len(y)
    return np.array([max(min(np.mean(y[j:k + 1]) for k in range(i, n)) for j in range(i + 1)) for i in range(n)])


@pytest.mark.slow  # the study fixture pretrains and trains every task's arms
def test_matched_kl_matches_an_independent_frontier(study):
    for task, result, _ in _each_task(study):
        matched = result["headline"]["matched_kl"]
        levels = _seed_mean(result["arms"]["sparse"]["runs"], "kl")
        assert matched["kl_levels"] == pytest.approx(levels.tolist())
        expected = {}
        for arm in ARMS:
            kl, reward = _seed_mean(result["arms"][arm]["runs"], "kl"), _seed_mean(result["arms"][arm]["runs"], "env_reward")
            order = np.argsort(kl, kind="stable")
            fitted = _isotonic_by_minmax(reward[order])
            np.testing.assert_allclose(matched["frontier"][arm]["reward"], fitted, rtol=1e-9, atol=1e-12)
            inside = (levels >= kl.min()) & (levels <= kl.max())
            expected[arm] = np.where(inside, np.interp(levels, kl[order], fitted), np.nan)
            got = np.array([np.nan if v is None else v for v in matched["reward"][arm]])
            np.testing.assert_allclose(got, expected[arm], rtol=1e-9, atol=1e-12)
        for other in ("sparse", "sparse_scaled"):
            for arm in ARMS:
                both = ~np.isnan(expected[arm]) & ~np.isnan(expected[other])
                gain = matched["mean_gain_vs"][other][arm]
                if both.any():
                    assert gain == pytest.approx(float(np.mean(expected[arm][both] - expected[other][both])), abs=1e-12)
                else:
                    assert gain is None
        # GRPO with the critic against GRPO without it, at grpo_sparse's KL levels
        grpo = result["headline"]["grpo_matched_kl"]
        levels = _seed_mean(result["arms"]["grpo_sparse"]["runs"], "kl")
        assert grpo["kl_levels"] == pytest.approx(levels.tolist()) and set(grpo["mean_gain_vs"]) == {"grpo_sparse"}
        at = {}
        for arm in GRPO_ARMS:
            kl, reward = _seed_mean(result["arms"][arm]["runs"], "kl"), _seed_mean(result["arms"][arm]["runs"], "env_reward")
            order = np.argsort(kl, kind="stable")
            inside = (levels >= kl.min()) & (levels <= kl.max())
            at[arm] = np.where(inside, np.interp(levels, kl[order], _isotonic_by_minmax(reward[order])), np.nan)
        both = ~np.isnan(at["grpo_dense"]) & ~np.isnan(at["grpo_sparse"])
        gain = grpo["mean_gain_vs"]["grpo_sparse"]["grpo_dense"]
        expected_gain = float(np.mean(at["grpo_dense"][both] - at["grpo_sparse"][both])) if both.any() else None
        assert gain == (None if expected_gain is None else pytest.approx(expected_gain, abs=1e-12)), task


def _timeless(run: dict) -> dict:
    return {"rounds": [{k: v for k, v in r.items() if k != "seconds"} for r in run["rounds"]], "eval": run["eval"]}


@pytest.mark.slow  # the study fixture pretrains and trains every task's arms
def test_added_arms_equal_the_full_studys_and_a_result_this_code_does_not_give_is_refused(study):
    """--add-arms: the GRPO arms run alone and added to a result without them are the full study's GRPO runs;
    a result whose sparse run or config this code does not reproduce is refused, naming the fix."""
    import copy

    from pipeline.studies.study import add_arms

    loaded, paths, configs = study
    result = copy.deepcopy(loaded["tasks"]["toxicity"])
    full = {arm: result["arms"].pop(arm) for arm in sorted(GRPO_ARMS)}
    add_arms(result, configs["toxicity"], sorted(GRPO_ARMS), scratch=paths["scratch"], progress=False)
    for arm, data in full.items():
        assert result["arms"][arm]["spec"] == data["spec"]
        assert [_timeless(run) for run in result["arms"][arm]["runs"]] == [_timeless(run) for run in data["runs"]]
        assert result["added"][arm]["critic"].get("requests", 0) == \
            loaded["tasks"]["toxicity"]["critic"]["by_arm"].get(arm, {}).get("requests", 0)
    assert result["added"]["grpo_dense"]["critic"]["requests"] > 0 and not result["added"]["grpo_sparse"]["critic"]
    changed = copy.deepcopy(loaded["tasks"]["toxicity"])
    changed["arms"]["sparse"]["runs"][0]["rounds"][1]["env_reward"] += 0.01
    with pytest.raises(DataError, match="re-running sparse seed 0 of toxicity gave other numbers"):
        add_arms(changed, configs["toxicity"], ["grpo_sparse"], scratch=paths["scratch"], progress=False)
    changed = copy.deepcopy(loaded["tasks"]["toxicity"])
    changed["config"]["rounds"] += 1
    with pytest.raises(DataError, match="made with another config"):
        add_arms(changed, configs["toxicity"], ["grpo_sparse"], scratch=paths["scratch"], progress=False)


def test_isotonic_frontier_by_hand():
    xs, fitted = isotonic_frontier([3.0, 1.0, 2.0, 4.0], [0.2, 0.5, 0.1, 0.9])
    assert xs == [1.0, 2.0, 3.0, 4.0]
    assert fitted == pytest.approx([0.8 / 3, 0.8 / 3, 0.8 / 3, 0.9])


def test_interpolation_and_steps_by_hand():
    assert interpolate_at([0.0, 2.0, 1.0], [0.0, 4.0, 1.0], [0.5, 1.5, 2.0, 2.5, -1.0]) == [0.5, 2.5, 4.0, None, None]
    assert steps_to_reach([0.1, 0.3, 0.2, 0.5], 0.25) == 2
    assert steps_to_reach([0.1, 0.2], 0.25) is None


@pytest.mark.slow  # the study fixture pretrains and trains every task's arms
def test_critic_accounting_and_zero_cost_ablation(study):
    for task, result, config in _each_task(study):
        critic = result["critic"]
        assert critic["requests"] == critic["calls"] + critic["cache_hits"] > 0
        assert critic["cache_hits"] > 0  # round 1 is identical in every dense arm: cache hits by construction
        assert critic["cost_usd"] == pytest.approx((critic["prompt_tokens"] * 0.5 + critic["completion_tokens"] * 1.5) / 1e6,
                                                   abs=1e-6)
        assert sum(a["requests"] for a in critic["by_arm"].values()) == critic["requests"]
        assert critic["by_arm"].get("sparse", {"requests": 0})["requests"] == 0
        ablation = result["ablation"]
        assert ablation["critic"]["calls"] == 0 and ablation["critic"]["requests"] > 0
        by_name = {s["setting"]["name"]: s for s in ablation["settings"]}
        assert {"alignment_substring", "no_critic", "rewards_0.5", "rewards_1"} <= set(by_name)
        # every label keeps its sign; twice the magnitude gives twice the intrinsic reward on the same rollouts
        assert {label: math.copysign(1.0, v) for label, v in by_name["rewards_1"]["setting"]["rewards"].items()} == \
            {label: math.copysign(1.0, v) for label, v in config.rewards.items()}
        assert by_name["rewards_1"]["intrinsic_per_response"] == pytest.approx(
            2 * by_name["rewards_0.5"]["intrinsic_per_response"], abs=1e-9)
    summarization = dict(study[0]["tasks"]["summarization"]["ablation"]["settings"][0]["setting"]["rewards"])
    assert set(summarization) == {"irrelevant", "incoherent", "factually incorrect"}


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^#### (\w+)$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


def _table(section: str) -> tuple[list[str], dict[str, list[str]]]:
    """(header cells, {arm: cells}) of the first table of a section whose first column is the arm."""
    header, rows = None, {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| arm |") and header is None:
            header = cells
        elif line.startswith("| ") and cells[0] in ARMS and header is not None and len(cells) == len(header):
            rows[cells[0]] = cells
    return header, rows


def _number(cell: str) -> float | None:
    return None if cell == "-" else float(cell)


@pytest.mark.slow  # the study fixture pretrains and trains every task's arms
def test_results_section_numbers_equal_the_json(study, tmp_path):
    loaded, paths, _ = study
    doc = tmp_path / "results.md"
    doc.write_text(f"# Results\n\nintro\n\n{BLOCK_START}\nold text\n{BLOCK_END}\n\n## after\n")
    splice_doc(doc, paths["markdown"].read_text())
    text = doc.read_text()
    assert text.startswith("# Results\n\nintro\n\n") and text.endswith(f"{BLOCK_END}\n\n## after\n")
    assert "old text" not in text
    sections = _sections(text)
    assert set(sections) == set(TASKS)
    checked = {"sentiment": ("eval positive %", "positive_percent", 0.05),
               "toxicity": ("eval exp. max toxicity", "expected_max_toxicity", 5e-4),
               "summarization": ("eval ROUGE-1", "rouge1", 0.05)}
    for task, section in sections.items():
        result = loaded["tasks"][task]
        header, rows = _table(section)
        assert set(rows) == ARMS, task
        h = result["headline"]
        for arm, cells in rows.items():
            steps = h["steps_to_target"][arm]
            assert _number(cells[1]) == steps["rounds"] and _number(cells[2]) == steps["rollouts"]
            for cell, value in ((cells[3], h["matched_kl"]["mean_gain_vs"]["sparse"][arm]),
                                (cells[4], h["matched_kl"]["mean_gain_vs"]["sparse_scaled"][arm])):
                assert (value is None) if cell == "-" else _number(cell) == pytest.approx(value, abs=5e-4)
            title, key, tol = checked[task]
            for cell, stat, tol in ((cells[header.index(title)], h["final_eval"][arm][key], tol),
                                    (cells[header.index("final KL")], h["final_rounds"][arm]["kl"], 5e-3)):
                mean, std = (float(x) for x in re.findall(r"-?\d+\.\d+", cell))
                assert mean == pytest.approx(stat["mean"], abs=tol) and std == pytest.approx(stat["std"], abs=tol)
        assert f"{result['critic']['calls']} calls" in section and f"{result['critic']['cache_hits']} cache hits" in section
        assert f"k = {result['scale_factor']['k']:.3f}" in section


@pytest.mark.slow  # the study fixture pretrains and trains every task's arms
def test_report_only_rebuilds_the_same_markdown_and_reads_the_old_layout(study, tmp_path):
    loaded, paths, _ = study
    out = tmp_path / "results"
    out.mkdir()
    (out / "sample_efficiency_smoke.json").write_text(paths["json"].read_text())
    assert main(["--preset", "smoke", "--report-only", "--out", str(out)]) == 0
    assert (out / "sample_efficiency_smoke.md").read_text() == paths["markdown"].read_text()
    old = dict(loaded["tasks"]["sentiment"])  # the layout before the per-task layer: one sentiment result
    old.pop("task")
    (out / "sample_efficiency_smoke.json").write_text(json.dumps(old))
    assert main(["--preset", "smoke", "--report-only", "--out", str(out)]) == 0
    rebuilt = json.loads((out / "sample_efficiency_smoke.json").read_text())
    assert set(rebuilt["tasks"]) == {"sentiment"}
    assert "#### sentiment" in (out / "sample_efficiency_smoke.md").read_text()


def test_splice_refuses_a_page_without_markers(tmp_path):
    doc = tmp_path / "results.md"
    doc.write_text("# Results\n")
    with pytest.raises(DataError, match="sample-efficiency:start"):
        splice_doc(doc, "section")
    assert doc.read_text() == "# Results\n"


def test_comment_grammar_recogniser_by_hand():
    from pipeline.studies.world_toxicity import is_comment_prefix
    from pipeline.data.toxicity_world import generate_comments

    assert all(is_comment_prefix(c) for c in generate_comments(200, seed=5))
    assert is_comment_prefix("You are a kind friend. What a stupid vid")  # a second sentence, cut mid-word
    assert is_comment_prefix("Thanks for the post, idiot.")  # polarity is ignored
    assert not is_comment_prefix("You are a kind friend friend.")
    assert not is_comment_prefix("You are kind")
    assert not is_comment_prefix("Your post is stupid.  ")  # two spaces


def test_toxicity_reward_is_a_sequence_label_classifier_not_the_lexicon():
    from pipeline.studies.world_toxicity import ToxicityStudyWorld, labelled_comments
    from pipeline.data.toxicity_world import TOXIC_WORDS

    pairs = labelled_comments(400, seed=3)
    toxic = set(TOXIC_WORDS["PADJ"] + TOXIC_WORDS["PERSON"])
    has_toxic = [any(w.strip(",.").lower() in toxic for w in text.split()) or any(o in text for o in TOXIC_WORDS["OPENER"])
                 for text, _ in pairs]
    assert all(label == 1 for (_, label), flagged in zip(pairs, has_toxic) if flagged)  # civil comments are clean
    assert any(label == 1 and not flagged for (_, label), flagged in zip(pairs, has_toxic))  # noisy labels exist
    world = ToxicityStudyWorld(world_seed=0, n_train_prompts=8, n_eval_prompts=2, classifier_size=400)
    civil, insult, neutral = world.env_rewards([" a kind friend.", " a stupid idiot.", ""])
    assert insult < 0.1 < 0.9 < civil
    assert 0.3 < neutral < 0.8  # no known word: the prior, not the lexicon's 1.0


def test_summary_kinds_by_hand():
    from pipeline.studies.world_summarization import summary_kind

    reference = "Fire burned down the old mill."
    assert summary_kind(" Fire burned down the old mill.", reference) == "reference"
    assert summary_kind("Floods closed the river road.", reference) == "wrong_event"
    assert summary_kind("Fire burned down.", reference) == "truncated"
    assert summary_kind("Fire burned down the old mill. The sky was clear.", reference) == "padded"
    assert summary_kind("The sky was clear.", reference) == "filler"
    assert summary_kind("Fire fire fire", reference) == "other"


def test_the_results_page_shows_the_committed_quick_results():
    """docs/results.md's section is the Markdown of benchmarks/results/sample_efficiency_quick.json, recomputed
    from its raw runs (so a hand edit of the JSON's headline or of the page fails here)."""
    from pipeline.studies.report import markdown

    committed = json.loads((ROOT / "benchmarks/results/sample_efficiency_quick.json").read_text())
    page = (ROOT / "docs" / "results.md").read_text()
    section = page.split(BLOCK_START, 1)[1].split(BLOCK_END, 1)[0]
    assert section.strip() == markdown(recompute_headlines(committed)).strip(), \
        "docs/results.md's sample-efficiency block differs from the JSON: re-render it with " \
        "`python benchmarks/sample_efficiency.py --quick --report-only --doc docs/results.md`"


def test_the_in_process_study_scores_its_rounds_with_the_score_stage():
    """runner._rollouts scores through pipeline/steps/score.py score_round: the world's reward in the task's units,
    score.scale applied once by shaping, and a bad value refused as the score stage refuses it."""
    from pipeline.core.config import ScoreParams
    from pipeline.core.errors import RewardError
    from pipeline.steps.score import score_round
    from pipeline.studies.runner import WorldReward
    from pipeline.studies.world_toxicity import ToxicityStudyWorld

    world = ToxicityStudyWorld(world_seed=0, n_train_prompts=8, n_eval_prompts=2, classifier_size=400)
    responses = [" a kind friend.", " a stupid idiot.", ""]
    rows = [{"rollout_id": f"r{i}", "prompt_id": f"p{i}", "query": "Say", "response": text}
            for i, text in enumerate(responses)]
    scores, metrics = score_round(rows, None, task="toxicity", run_id="t", round_=1, params=ScoreParams(scale=3.0),
                                  reward=WorldReward(world), progress=False)
    assert [s["env_reward"] for s in scores] == world.env_rewards(responses)
    assert [s["env_reward_shaped"] for s in scores] == pytest.approx([3.0 * s["env_reward"] for s in scores])
    assert metrics["scorer"] == "study:ToxicityStudyWorld"
    world.env_rewards = lambda texts, queries=None: [float("nan")] * len(texts)
    refused = r"scorer 'study:ToxicityStudyWorld' \(pipeline/studies/runner.py\) returned nan .* response r0"
    with pytest.raises(RewardError, match=refused):
        score_round(rows, None, task="toxicity", run_id="t", round_=1, params=ScoreParams(),
                    reward=WorldReward(world), progress=False)
