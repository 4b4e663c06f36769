"""`drlc study` for real: a shrunken demo, 2 arms x 2 seeds x 2 rounds as DVC experiments, two workers.

Checks what the command promises: `dvc exp show` lists the four experiments; the report has every section;
the arms of a seed are paired (same round-1 rollouts, same round-2 prompts; another seed differs); queued
experiments wrote the workspace's critic cache; a second run runs nothing and sends no critic request;
--report-only reports a grid part-way without touching the queue.
"""
import io
import json
import subprocess
from pathlib import Path

import pytest
import yaml
from e2e import dvc, experiment_project, tiny_params

from pipeline.commands import study
from pipeline.core.cache import CriticCache


def lock_outs(project: Path, rev: str, stage: str) -> list:
    lock = yaml.safe_load(subprocess.run(["git", "show", f"{rev}:dvc.lock"], cwd=project, capture_output=True,
                                         text=True, check=True).stdout)
    return [out["md5"] for out in lock["stages"][stage]["outs"]]


def prompt_ids(project: Path, rev: str, round_: int) -> list[str]:
    import dvc.api
    import pyarrow.parquet as pq

    path = f"data/rollouts/round={round_:04d}/part-0.parquet"
    with dvc.api.open(path, repo=str(project), rev=rev, mode="rb") as f:
        return pq.read_table(io.BytesIO(f.read())).column("prompt_id").to_pylist()


@pytest.mark.slow
def test_study_runs_pairs_reports_and_resumes(tmp_path, monkeypatch):
    project = experiment_project(tmp_path, tiny_params(n_rounds=2), monkeypatch)
    arms = study.pick_arms(study.load_arms(), ["sparse", "dense"])
    out = tmp_path / "report"
    report = study.study(project, arms=arms, seeds=[0, 1], jobs=2, rounds=2, out=out,
                         sets=["evaluate.n_prompts=4"])
    assert report["experiments_run"] == 4
    shown = study.existing(project)
    assert sorted(shown) == ["dense-s0", "dense-s1", "sparse-s0", "sparse-s1"]

    written = json.loads((out / "report.json").read_text())
    assert written["metric"] == "world/positive_percent" and set(written["arms"]) == {"sparse", "dense"}
    for arm, summary in written["arms"].items():
        assert summary["seeds"] == [0, 1] and summary["eval"][written["metric"]]["n"] == 2
        assert summary["kl_end"]["n"] == 2 and [x for x, _ in summary["curve"]] == [0, 32, 64]  # base + 2 rounds
        assert set(summary["critic"]) == {"critic_requests", "cache_hits", "critic_tokens", "critic_cost_usd"}
    # the report's final numbers are dvc exp show's, and the curve ends at them
    final = shown["dense-s1"]["metrics"]["metrics/eval.json"]["round=0002"]["world"]["positive_percent"]
    dense = [r for r in (study.collect(project, [("dense", 1)])["dense"])][0]
    assert dense["eval"]["world/positive_percent"] == final == dense["eval_curve"][-1]["world/positive_percent"]
    plots = json.loads(dvc(["plots", "diff", "dense-s1", "sparse-s1", "--json"], project).stdout)["data"]
    values = plots["metrics/eval_rounds.json"][0]["content"]["data"]["values"]
    assert [v["world/positive_percent"] for v in values if v["rev"] == "dense-s1"] == \
        [p["world/positive_percent"] for p in dense["eval_curve"]]  # dvc plots diff draws the report's curve
    diff = written["differences"]["dense-sparse"][written["metric"]]
    assert diff["seeds"] == [0, 1] and diff["half"] is not None
    assert written["arms"]["sparse"]["critic"]["critic_requests"] == 0
    assert written["arms"]["dense"]["critic"]["critic_requests"] > 0
    text = (out / "report.md").read_text()
    assert "| dense | 2 |" in text and "| dense-sparse | 2 |" in text and "critic requests" in text
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"

    # pairing: a seed's arms trained on the same round-1 rollouts and the same round-2 prompts; seeds differ
    revs = {name: exp["rev"] for name, exp in shown.items()}
    first = {name: lock_outs(project, rev, "rollout@0001") for name, rev in revs.items()}
    assert first["sparse-s0"] == first["dense-s0"] and first["sparse-s1"] == first["dense-s1"]
    assert first["sparse-s0"] != first["sparse-s1"]
    assert prompt_ids(project, revs["sparse-s1"], 2) == prompt_ids(project, revs["dense-s1"], 2)

    # the queued experiments (run under .dvc/tmp/exps) wrote the workspace's cache/critic
    with CriticCache(project / "cache" / "critic") as cache:
        before = cache.stats()
    assert before["entries"] > 0
    again = study.study(project, arms=arms, seeds=[0, 1], jobs=2, rounds=2, out=out, sets=["evaluate.n_prompts=4"])
    assert again["experiments_run"] == 0
    with CriticCache(project / "cache" / "critic") as cache:
        after = cache.stats()
    assert after["requests"] == before["requests"] and after["entries"] == before["entries"]
    assert again["differences"] == json.loads(json.dumps(report["differences"]))
    assert "Failed" not in dvc(["queue", "status"], project).stdout

    # --report-only on a grid with a seed more: queues and runs nothing, reports the four, names the two missing
    partial = study.study(project, arms=arms, seeds=[0, 1, 2], rounds=2, out=tmp_path / "partial",
                          sets=["evaluate.n_prompts=4"], report_only=True)
    assert partial["experiments_run"] == 0 and partial["missing"] == ["sparse-s2", "dense-s2"]
    assert partial["differences"] == again["differences"]
    assert "s2" not in dvc(["queue", "status"], project).stdout and sorted(study.existing(project)) == sorted(shown)
    assert "Not finished, so not in this report: sparse-s2, dense-s2." in (tmp_path / "partial" / "report.md").read_text()


@pytest.mark.slow  # two one-round experiments of one seed on one worker
def test_a_leftover_queue_stop_does_not_strand_the_queue(tmp_path, monkeypatch, capfd):
    import time

    project = experiment_project(tmp_path, tiny_params(n_rounds=1), monkeypatch)
    # a worker that has run once leaves its control queue in DVC's broker; a stop sent after it is gone waits
    # there, and the next worker takes it and exits after one experiment (what stranded the CommonGen study)
    dvc(["queue", "start"], project)  # with nothing queued, the worker stops itself (its monitor) within seconds
    log = project / ".dvc/tmp/exps/celery/dvc-exp-worker-1.out"
    for _ in range(120):
        if log.is_file() and log.read_text().rstrip().endswith("done"):
            break
        time.sleep(1)
    else:
        raise AssertionError(f"the DVC queue worker did not start and stop by itself: {log}")
    dvc(["queue", "stop"], project)  # no worker is up: this stop is the leftover
    monkeypatch.setattr(study, "POLL_S", 2.0)
    # one seed: the second experiment takes prepare, base and round 1's rollout from DVC's run cache
    arms = study.pick_arms(study.load_arms(), ["sparse", "dense"])
    report = study.study(project, arms=arms, seeds=[0], jobs=1, rounds=1, out=tmp_path / "report",
                         sets=["evaluate.n_prompts=4"])
    assert "the DVC queue worker is gone with experiments still queued" in capfd.readouterr().out
    assert report["experiments_run"] == 2 and sorted(study.existing(project)) == ["dense-s0", "sparse-s0"]
    for _ in range(60):  # the worker stops by itself once the queue is empty (drlc sends no `dvc queue stop`)
        if not study.worker_alive(project):
            break
        time.sleep(1)
    assert not study.worker_alive(project)


@pytest.mark.slow  # three one-round experiments of one seed, then three of a second, on one worker, through the CLI
def test_a_grid_finishes_in_an_empty_home_with_no_git_identity(tmp_path, monkeypatch):
    """A new user's machine: no ~/.gitconfig, no user.name/user.email. The second phase (sparse_scaled) queues
    and runs too; drlc signs DVC's experiment commits, and leaves the user's git config unwritten. A seed added
    later is matched with the k the first seed's matched experiment ran with."""
    import sys

    project = experiment_project(tmp_path, tiny_params(n_rounds=1), monkeypatch)
    for key in ("user.name", "user.email"):
        subprocess.run(["git", "config", "--unset", key], cwd=project, check=True)
    for name in ("HOME", "XDG_CONFIG_HOME"):
        monkeypatch.setenv(name, str(tmp_path / "home"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for variable in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL"):
        monkeypatch.delenv(variable, raising=False)
    out = project / "study"  # the default --out: inside the project, where `dvc plots show` reads files
    result = subprocess.run([sys.executable, "-m", "pipeline", "study", "--arms", "sparse", "dense", "sparse_scaled",
                             "--seeds", "0", "--rounds", "1", "-S", "evaluate.n_prompts=4", "--project", str(project)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "signed 'drlc study <drlc-study@localhost>'" in result.stdout
    report = json.loads((out / "report.json").read_text())
    assert set(report["arms"]) == {"sparse", "dense", "sparse_scaled"} and report["scale_k"] > 0
    assert set(report["matched_kl"]) == {"dense-sparse", "dense-sparse_scaled", "sparse_scaled-sparse"}
    # one round: the eval curve has the base and the end only, a straight line, so no frontier and no matched KL
    assert report["arms"]["sparse_scaled"]["frontier"] is None and set(report["matched_kl"].values()) == {None}
    assert "no eval curve with kl_to_base and a point between the base and the end" in (out / "report.md").read_text()
    assert subprocess.run(["git", "config", "--get", "user.name"], cwd=project).returncode != 0
    points = json.loads((out / "frontier.json").read_text())["points"]
    assert {p["arm"] for p in points} == {"sparse", "dense", "sparse_scaled"}
    drawn = json.loads(dvc(["plots", "show", "study/frontier.json", "-x", "kl_to_base", "-y", report["metric"],
                            "--json"], project).stdout)["data"]["study/frontier.json"][0]["content"]["data"]["values"]
    assert [(p["kl_to_base"], p[report["metric"]]) for p in drawn] == \
        [(p["kl_to_base"], p[report["metric"]]) for p in points]  # dvc plots draws the frontier's points

    # a seed added later: sparse and dense of both seeds give another k, yet sparse_scaled-s1 runs with seed 0's
    # (one k per report: else the report would stop at "ran with different k")
    result = subprocess.run([sys.executable, "-m", "pipeline", "study", "--arms", "sparse", "dense", "sparse_scaled",
                             "--seeds", "0", "1", "--rounds", "1", "-S", "evaluate.n_prompts=4",
                             "--project", str(project)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"score.scale k = {report['scale_k']:.4f}, kept from the matched experiments" in result.stdout
    shown = study.existing(project)
    assert shown["sparse_scaled-s1"]["params"]["score"]["scale"] == report["scale_k"]
    assert json.loads((out / "report.json").read_text())["scale_k"] == report["scale_k"]
