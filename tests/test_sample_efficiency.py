"""The sample-efficiency study (benchmarks/sample_efficiency.py) on a tiny smoke configuration.

One module-scoped run of the whole study (base pretraining, five arms x 2 seeds x 3 rounds, the
replay ablation, plots and Markdown) feeds every test; each derived number is recomputed here
with numpy from the raw per-round records, independently of benchmarks/sample_efficiency_lib.
"""
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.sample_efficiency import write_outputs  # noqa: E402
from benchmarks.sample_efficiency_lib.analysis import interpolate_at, isotonic_frontier, steps_to_reach  # noqa: E402
from benchmarks.sample_efficiency_lib.config import preset  # noqa: E402
from benchmarks.sample_efficiency_lib.report import README_END, README_START, splice_readme  # noqa: E402
from benchmarks.sample_efficiency_lib.study import run_study  # noqa: E402
from pipeline.errors import DataError  # noqa: E402

ARMS = {"sparse", "sparse_scaled", "dense_all", "dense_selective", "dense_zero_mean"}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """(result loaded back from the written JSON, output paths, config) of one smoke study."""
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("study")
    config = preset("smoke")
    result = run_study(config, scratch=tmp / "scratch", progress=False)
    paths = write_outputs(result, tmp / "results")
    return json.loads(paths["json"].read_text()), paths, config


def _seed_mean(runs, key):
    return np.array([[r[key] for r in run["rounds"]] for run in runs]).mean(axis=0)


def test_json_has_every_arm_seed_and_round(study):
    result, paths, config = study
    assert set(result["arms"]) == ARMS
    for arm, data in result["arms"].items():
        assert [run["seed"] for run in data["runs"]] == list(config.seeds)
        for run in data["runs"]:
            assert [r["round"] for r in run["rounds"]] == list(range(1, config.rounds + 1))
            assert [r["rollouts"] for r in run["rounds"]] == [i * config.batch_size for i in range(1, config.rounds + 1)]
            assert all(0.0 <= r["env_reward"] <= 1.0 and math.isfinite(r["kl"]) for r in run["rounds"])
            assert 0.0 <= run["eval"]["grammatical"] <= 1.0
    assert (paths["json"].parent / result["images"]["learning_curves"]).stat().st_size > 1000
    assert (paths["json"].parent / result["images"]["frontier"]).stat().st_size > 1000


def test_arm_rewards_are_what_each_arm_promises(study):
    result, _, config = study
    k = result["scale_factor"]["k"]
    assert result["arms"]["sparse_scaled"]["spec"]["env_scale"] == pytest.approx(k)
    for arm, factor in (("sparse", 1.0), ("sparse_scaled", k), ("dense_zero_mean", 1.0)):
        for run in result["arms"][arm]["runs"]:
            for r in run["rounds"]:  # no net intrinsic reward: total = scale x env
                assert r["total_reward"] == pytest.approx(factor * r["env_reward"], abs=1e-6)
    for run in result["arms"]["dense_all"]["runs"]:
        assert all(r["critiqued"] == config.batch_size for r in run["rounds"])
    for run in result["arms"]["sparse"]["runs"]:
        assert all(r["critiqued"] == 0 for r in run["rounds"])
    # round 1 samples the base policy with the same seed in every arm: identical rollouts
    for i in range(len(config.seeds)):
        firsts = {result["arms"][a]["runs"][i]["rounds"][0]["env_reward"] for a in ARMS}
        assert len(firsts) == 1


def test_scale_factor_matches_an_independent_computation(study):
    result, _, _ = study
    dense = np.mean([r["total_reward"] for run in result["arms"]["dense_all"]["runs"] for r in run["rounds"]])
    sparse = np.mean([r["env_reward"] for run in result["arms"]["sparse"]["runs"] for r in run["rounds"]])
    assert result["scale_factor"]["k"] == pytest.approx(dense / sparse, rel=1e-9)


def test_steps_to_target_match_an_independent_computation(study):
    result, _, config = study
    target = _seed_mean(result["arms"]["sparse"]["runs"], "env_reward")[-config.final_window:].mean()
    assert result["headline"]["sparse_target"] == pytest.approx(target, rel=1e-9)
    for arm in ARMS:
        curve = _seed_mean(result["arms"][arm]["runs"], "env_reward")
        hits = np.nonzero(curve >= target)[0]
        expected = int(hits[0]) + 1 if len(hits) else None
        got = result["headline"]["steps_to_target"][arm]
        assert got["rounds"] == expected
        assert got["rollouts"] == (None if expected is None else expected * config.batch_size)
    assert result["headline"]["steps_to_target"]["sparse"]["rounds"] is not None  # sparse reaches its own target


def _isotonic_by_minmax(y):
    """Isotonic regression by its min-max formula: fit_i = max_{j<=i} min_{k>=i} mean(y[j..k])."""
    n = len(y)
    return np.array([max(min(np.mean(y[j:k + 1]) for k in range(i, n)) for j in range(i + 1)) for i in range(n)])


def test_matched_kl_matches_an_independent_frontier(study):
    result, _, _ = study
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


def test_isotonic_frontier_by_hand():
    xs, fitted = isotonic_frontier([3.0, 1.0, 2.0, 4.0], [0.2, 0.5, 0.1, 0.9])
    assert xs == [1.0, 2.0, 3.0, 4.0]
    assert fitted == pytest.approx([0.8 / 3, 0.8 / 3, 0.8 / 3, 0.9])


def test_interpolation_and_steps_by_hand():
    assert interpolate_at([0.0, 2.0, 1.0], [0.0, 4.0, 1.0], [0.5, 1.5, 2.0, 2.5, -1.0]) == [0.5, 2.5, 4.0, None, None]
    assert steps_to_reach([0.1, 0.3, 0.2, 0.5], 0.25) == 2
    assert steps_to_reach([0.1, 0.2], 0.25) is None


def test_critic_accounting_and_zero_cost_ablation(study):
    result, _, _ = study
    critic = result["critic"]
    assert critic["requests"] == critic["calls"] + critic["cache_hits"] > 0
    assert critic["cache_hits"] > 0  # round 1 is identical in every dense arm: cache hits by construction
    assert critic["cost_usd"] == pytest.approx((critic["prompt_tokens"] * 0.5 + critic["completion_tokens"] * 1.5) / 1e6,
                                               abs=1e-6)
    assert sum(a["requests"] for a in critic["by_arm"].values()) == critic["requests"]
    assert critic["by_arm"].get("sparse", {"requests": 0})["requests"] == 0
    ablation = result["ablation"]
    assert ablation["critic"]["calls"] == 0 and ablation["critic"]["requests"] > 0
    names = [s["setting"]["name"] for s in ablation["settings"]]
    assert "alignment_substring" in names and "no_critic" in names
    by_name = {s["setting"]["name"]: s for s in ablation["settings"]}
    # twice the reward per span token gives twice the intrinsic reward on the same recorded rollouts
    assert by_name["rewards_1"]["intrinsic_per_response"] == pytest.approx(
        2 * by_name["rewards_0.5"]["intrinsic_per_response"], abs=1e-9)


def _table_rows(text: str) -> dict[str, list[str]]:
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] in ARMS:
            rows[cells[0]] = cells
    return rows


def _number(cell: str) -> float | None:
    return None if cell == "-" else float(cell)


def test_readme_section_numbers_equal_the_json(study, tmp_path):
    result, paths, _ = study
    readme = tmp_path / "README.md"
    readme.write_text(f"# drlc\n\nintro\n\n{README_START}\nold text\n{README_END}\n\n## after\n")
    splice_readme(readme, paths["markdown"].read_text())
    text = readme.read_text()
    assert text.startswith("# drlc\n\nintro\n\n") and text.endswith(f"{README_END}\n\n## after\n")
    assert "old text" not in text
    rows = _table_rows(text)
    assert set(rows) == ARMS
    h = result["headline"]
    for arm, cells in rows.items():
        steps = h["steps_to_target"][arm]
        assert _number(cells[1]) == steps["rounds"] and _number(cells[2]) == steps["rollouts"]
        for cell, value in ((cells[3], h["matched_kl"]["mean_gain_vs"]["sparse"][arm]),
                            (cells[4], h["matched_kl"]["mean_gain_vs"]["sparse_scaled"][arm])):
            assert (value is None) if cell == "-" else _number(cell) == pytest.approx(value, abs=5e-4)
        for cell, stat, tol in ((cells[5], h["final_eval"][arm]["positive_percent"], 0.05),
                                (cells[6], h["final_eval"][arm]["env_reward_mean"], 5e-4),
                                (cells[9], h["final_rounds"][arm]["kl"], 5e-3)):
            mean, std = (float(x) for x in re.findall(r"-?\d+\.\d+", cell))
            assert mean == pytest.approx(stat["mean"], abs=tol) and std == pytest.approx(stat["std"], abs=tol)
    assert f"{result['critic']['calls']} calls" in text and f"{result['critic']['cache_hits']} cache hits" in text
    assert f"k = {result['scale_factor']['k']:.3f}" in text


def test_splice_refuses_a_readme_without_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# drlc\n")
    with pytest.raises(DataError, match="sample-efficiency:start"):
        splice_readme(readme, "section")
    assert readme.read_text() == "# drlc\n"
