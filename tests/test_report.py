"""`write_report`: metrics side by side with deltas, a curves PNG, clear errors for unfinished runs."""
import json
from pathlib import Path

import pytest
from inprocess import drlc

from pipeline.commands.report import load_run, write_report
from pipeline.core.errors import DataError


def _run(root: Path, name: str, policy: str, positive: float, curves: list[tuple]) -> Path:
    run = root / name
    (run / "metrics").mkdir(parents=True)
    evaluation = {"base": {"world": {"positive_percent": 40.0, "perplexity": 12.5}},
                  policy: {"world": {"positive_percent": positive, "perplexity": 14.0}}}
    rounds = [{"round": r, "env_reward_mean": env, "intrinsic_reward_sum": 0.1, "kl": kl, "kl_coef": 0.2,
               "critiqued": calls, "critic_requests": calls, "cache_hits": 0, "cache_hit_rate": 0.0,
               "critic_cost_usd": 0.5, "critic_cost_usd_total": 0.5 * r}
              for r, env, kl, calls in curves]
    (run / "metrics" / "eval.json").write_text(json.dumps(evaluation))
    (run / "metrics" / "rounds.json").write_text(json.dumps({"rounds": rounds}))
    return run


def test_report_table_has_every_metric_and_deltas_vs_the_first_run(tmp_path):
    sparse = _run(tmp_path, "sparse", "round=0002", 50.0, [(1, 0.1, 0.01, 0), (2, 0.2, 0.02, 0)])
    dense = _run(tmp_path, "dense", "round=0003", 62.5, [(1, 0.1, 0.01, 10), (2, 0.3, 0.03, 8), (3, 0.5, 0.05, 6)])
    paths = write_report([str(sparse), str(dense)], str(tmp_path / "reports"))
    assert set(paths) == {"markdown", "curves_png"}
    text = paths["markdown"].read_text()
    assert "| metric | sparse | dense | Δ dense − sparse |" in text
    assert "| final/world/positive_percent | 50 | 62.5 | +12.5 |" in text  # different last rounds line up as final
    assert "| base/world/perplexity | 12.5 | 12.5 | 0 |" in text
    assert "| train/rounds | 2 | 3 | +1 |" in text
    assert "| train/critic_requests_total | 0 | 24 | +24 |" in text
    assert "| train/critic_cost_usd_total | 1 | 1.5 | +0.5 |" in text
    assert "| train/last_round_kl | 0.02 | 0.05 | +0.03 |" in text
    png = paths["curves_png"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_a_single_run_has_no_delta_column(tmp_path):
    run = _run(tmp_path, "a", "round=0001", 50.0, [(1, 0.1, 0.01, 3)])
    text = write_report([str(run)], str(tmp_path / "out"))["markdown"].read_text()
    assert "| metric | a |\n" in text and "Δ" not in text.split("## Metrics")[1].split("\n\n")[1]


def test_load_run_flattens_metric_names(tmp_path):
    metrics, curves = load_run(_run(tmp_path, "a", "round=0001", 50.0, [(1, 0.1, 0.01, 3)]))
    assert metrics["final/world/positive_percent"] == 50.0 and metrics["base/world/positive_percent"] == 40.0
    assert len(curves) == 1


def test_unfinished_runs_raise_data_error(tmp_path):
    with pytest.raises(DataError, match="not found"):
        write_report([str(tmp_path / "nope")], str(tmp_path / "r"))
    (tmp_path / "half" / "metrics").mkdir(parents=True)
    (tmp_path / "half" / "metrics" / "eval.json").write_text("{}")
    with pytest.raises(DataError, match="has no metrics/rounds.json"):
        write_report([str(tmp_path / "half")], str(tmp_path / "r"))
    with pytest.raises(DataError, match="No run folder"):
        write_report([], str(tmp_path / "r"))


def test_a_run_without_metrics_exits_2_with_one_line(tmp_path):
    (tmp_path / "run").mkdir()
    result = drlc(["report", tmp_path / "run", "--out", tmp_path / "r"], tmp_path)  # in-process (tests/inprocess.py)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"drlc: error: Run folder '{tmp_path / 'run'}' has no metrics/rounds.json: pass the output folder of a "
        "finished run (after `dvc repro`)."]
    assert sorted(tmp_path.rglob("*")) == [tmp_path / "run"]  # no report folder


def test_a_replay_folder_without_evaluation_reports_its_training_rows(tmp_path):
    run = _run(tmp_path, "a", "round=0001", 50.0, [(1, 0.1, 0.01, 3)])
    (run / "metrics" / "eval.json").unlink()
    metrics, _ = load_run(run)
    assert metrics["train/rounds"] == 1 and not any(k.startswith(("base/", "final/")) for k in metrics)


def _samples(run: Path, scores: dict[str, list[float]], *, queries: dict | None = None, policy: str = "round=0002"):
    """Write data/eval_samples/<policy> with the given RM scores per prompt id (plus base rows that must be ignored)."""
    from pipeline.core.store import SCHEMAS, write_table

    rows = []
    for name, prompt_scores in (("base", {k: [99.0] for k in scores}), (policy, scores)):
        for prompt_id, values in prompt_scores.items():
            rows += [{"run_id": "r", "round": 2, "policy": name, "prompt_id": prompt_id, "sample": i,
                      "prompt_set": prompt_id.split("/")[0], "response": "s",
                      "query": (queries or {}).get(prompt_id, f"doc {prompt_id} TL;DR:"),
                      "env_reward": 0.0, "positive_prob": None, "perplexity": 1.0, "rm_score": v}
                     for i, v in enumerate(values)]
    assert all(set(r) == set(SCHEMAS["eval_samples"].names) for r in rows)
    write_table(rows, "eval_samples", run / "data" / "eval_samples" / policy)


def test_pairwise_rm_win_rate_of_two_summarization_runs(tmp_path):
    first = _run(tmp_path, "first", "round=0002", 50.0, [(1, 0.1, 0.01, 0)])
    second = _run(tmp_path, "second", "round=0002", 50.0, [(1, 0.1, 0.01, 0)])
    _samples(first, {"world/e0": [1.0, 3.0], "world/e1": [5.0], "world/e3": [0.0]})
    # e2 is only in the second run; e3 names another document there: neither is compared
    _samples(second, {"world/e0": [2.0], "world/e1": [5.0, 4.0], "world/e2": [7.0], "world/e3": [9.0]},
             queries={"world/e3": "another doc TL;DR:"})
    text = write_report([str(first), str(second)], str(tmp_path / "r"))["markdown"].read_text()
    # e0: 2 beats 1, loses to 3 -> 1/2; e1: 5 ties 5, 4 loses to 5 -> 1/4; mean over the 2 shared prompts
    assert "| world | second | first | 0.375 | 2 |" in text
    assert "## Pairwise win rate (reward model)" in text


def test_runs_without_rm_scores_or_with_old_tables_get_no_win_rate_section(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    first = _run(tmp_path, "first", "round=0002", 50.0, [(1, 0.1, 0.01, 0)])
    old = _run(tmp_path, "old", "round=0002", 50.0, [(1, 0.1, 0.01, 0)])
    _samples(first, {"world/e0": [1.0]})
    folder = old / "data" / "eval_samples" / "round=0002"
    folder.mkdir(parents=True)
    old_row = {"policy": "round=0002", "prompt_id": "world/e0", "query": "doc world/e0 TL;DR:", "env_reward": 1.0}
    pq.write_table(pa.Table.from_pylist([old_row]), folder / "part-0.parquet")  # written before rm_score existed
    text = write_report([str(first), str(old)], str(tmp_path / "r"))["markdown"].read_text()
    assert "Pairwise win rate" not in text and "| final/world/positive_percent | 50 | 50 | 0 |" in text
