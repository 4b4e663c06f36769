"""The length sweep's report (benchmarks/study_length.py, pipeline.studies.study_report.versus_best_control): dense
against the better of the two matched sparse controls, at matched KL and at the end point, by hand."""
import json

import pytest
from test_study import kl_record

from benchmarks import study_length
from pipeline.studies import study_report


def grid(dense_end: float, lowkl_end: float, requests: int = 6) -> dict:
    """Two seeds of dense, sparse_scaled and sparse_lowkl; dense's curve reaches KL 1.0, the controls' 2.0."""
    by_arm = {"dense": [kl_record("dense", s, [0, 0.5, 1.0], [0.1, 0.3, dense_end + 0.01 * s]) for s in (0, 1)],
              "sparse_scaled": [kl_record("sparse_scaled", s, [0, 1.0, 2.0], [0.1, 0.2, 0.25]) for s in (0, 1)],
              "sparse_lowkl": [kl_record("sparse_lowkl", s, [0, 1.0, 2.0], [0.1, 0.3, lowkl_end + 0.02 * s])
                               for s in (0, 1)]}
    for run in by_arm["dense"]:
        run["critic"]["critic_requests"] = requests
    return study_report.build_report(by_arm) | {"arms_run": list(by_arm)}


def test_dense_is_read_against_the_better_control_at_matched_kl_and_at_the_end():
    report = grid(dense_end=0.5, lowkl_end=0.6)
    assert study_report.best_control(report) == "sparse_lowkl"  # 0.61 mean against sparse_scaled's 0.25
    row = study_report.versus_best_control(report)
    # at KL 1.0 (dense's end): dense 0.50 / 0.51, sparse_lowkl at its round 1: 0.30 -> +0.20, +0.21
    assert row["control"] == "sparse_lowkl" and row["at_kl"]["mean"] == pytest.approx(0.205)
    assert row["at_kl"]["kl"]["mean"] == pytest.approx(1.0)
    assert row["end"]["mean"] == pytest.approx(0.505 - 0.61)  # the end points favour the control that drifted
    # 6 requests per experiment for 20.5 points (0.01 each) of gain
    assert row["critic_per_experiment"]["critic_requests"] == 6
    assert row["critic_per_point"]["critic_requests"] == pytest.approx(6 / 20.5)
    worse = study_report.versus_best_control(grid(dense_end=0.25, lowkl_end=0.6))  # at KL 1: 0.25 - 0.30 < 0
    assert worse["critic_per_point"] is None


def test_a_point_of_a_percent_metric_is_one_percent():
    assert study_report.point("world/positive_percent") == 1.0 and study_report.point("world/coverage") == 0.01
    report = grid(dense_end=0.5, lowkl_end=0.6) | {"metric": "world/positive_percent"}
    for arm in report["arms"].values():
        arm["eval"]["world/positive_percent"] = arm["eval"]["world/coverage"]
    report["matched_kl"] = {"dense-sparse_lowkl": {"mean": 4.0}}  # 4 percentage points of gain
    assert study_report.versus_best_control(report)["critic_per_point"]["critic_requests"] == pytest.approx(6 / 4)


def test_the_sweep_renders_from_its_committed_json_alone(tmp_path):
    result = study_length.record({"64": grid(0.5, 0.6), "24": grid(0.4, 0.3)}, name="t", note="Tiny grids.")
    text = study_length.render(json.loads(json.dumps(result)))
    table = text.split("\n\n")[2].splitlines()
    assert table[2].startswith("| 24 | sparse_lowkl | 2 | 1.00 ± 0.00 | +0.105 ± ")
    assert table[3].startswith("| 64 | sparse_lowkl | 2 | 1.00 ± 0.00 | +0.205 ± ")
    assert table[3].endswith("| 6 | 0.293 |") and "Tiny grids." in text  # 6 / 20.5 requests per point
    assert "#### t, rollout.max_new_tokens = 24" in text
    png = study_report.plot_sweep(study_length.rows(result), "rollout.max_new_tokens", "world/coverage",
                                  tmp_path / "sweep.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("path", sorted(study_length.RESULTS.glob("study_length_*.json")), ids=lambda p: p.stem)
def test_the_page_holds_each_committed_sweep(path):
    result = json.loads(path.read_text())
    page = (study_length.ROOT / "docs/results.md").read_text()
    start, end = study_length.markers(result["name"])
    assert page.split(start, 1)[1].split(end, 1)[0].strip("\n") == study_length.render(result).strip("\n")
