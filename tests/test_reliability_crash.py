"""Crashes: kill -9 the critique and ppo stages at seeded random points, then resume.

After each kill the stage's Parquet output is whole or absent (atomic writes); re-running the
stage completes; the critic requests answered and cached before the kill are not sent again
(re-sent = unique requests - cached answers, counted on the server); and the resumed output
equals an uninterrupted run's (minus pipeline.core.store.VOLATILE_COLUMNS). One critique kill is of
`dvc repro` itself (whole process group) in a copy of the finished project, resumed by `dvc repro`.
"""
import json
import random
import shutil
import sys
import time

import pytest
import yaml
from reliability import (
    assert_whole_or_absent,
    critic_server,
    critique_cmd,
    kill_group,
    ppo_cmd,
    run_logged,
    shrunken_run,
    start,
    table_rows,
    wait_until,
    workdir_for,
)
from safetensors.torch import load_file

from pipeline.core.cache import CriticCache

pytestmark = pytest.mark.slow  # each builds a finished run with dvc repro (shrunken_run)

SEED = 20240531
LATENCY_S = 0.08


def cache_entries(directory) -> int:
    if not directory.exists():
        return 0
    with CriticCache(directory) as cache:
        return sum(1 for _ in cache.keys())


@pytest.fixture(scope="module")
def critique_setup(tmp_path_factory):
    run = shrunken_run()
    tmp = tmp_path_factory.mktemp("crash")
    with critic_server(port=run["port"], latency_s=LATENCY_S) as server:
        workdir = workdir_for(tmp / "reference", run["params"], cache_dir=str(tmp / "reference" / "cache"),
                              threshold=1.0, max_concurrency=4)
        before = server.stats()["requests"]
        result = run_logged(critique_cmd(run["project"], workdir / "out", workdir / "m.json"), workdir)
        assert result.returncode == 0, result.stderr[-2000:]
        unique = server.stats()["requests"] - before
        yield {"run": run, "server": server, "tmp": tmp, "unique": unique,
               "reference": table_rows(workdir / "out", "annotations")}


def test_killed_critique_resumes_without_resending_answered_requests(critique_setup):
    run, server, unique = critique_setup["run"], critique_setup["server"], critique_setup["unique"]
    points = sorted(random.Random(SEED).sample(range(1, unique - 4), 3)) + [unique]  # last: after every answer
    report = []
    for point in points:
        workdir = workdir_for(critique_setup["tmp"] / f"kill{point}", run["params"], threshold=1.0,
                              cache_dir=str(critique_setup["tmp"] / f"kill{point}" / "cache"), max_concurrency=4)
        out, start_count = workdir / "out", server.stats()["completions"]
        process = start(critique_cmd(run["project"], out, workdir / "m.json"), workdir)
        reached = wait_until(lambda: server.stats()["completions"] - start_count >= point, 60, process)
        assert reached, process.communicate()[1][-2000:]
        kill_group(process)
        answered = server.stats()["completions"] - start_count
        assert_whole_or_absent(out)
        cached = cache_entries(workdir / "cache")
        assert cached >= answered - 4  # at most the in-flight requests were answered but not yet stored
        before = server.stats()["requests"]
        result = run_logged(critique_cmd(run["project"], out, workdir / "m.json"), workdir)
        assert result.returncode == 0, result.stderr[-2000:]
        resent = server.stats()["requests"] - before
        assert resent == unique - cached, (point, resent, unique, cached)
        assert table_rows(out, "annotations") == critique_setup["reference"]
        report.append((point, answered, cached, resent))
    print(f"\ncritique kill points (completions at kill, answered, cached, re-sent of {unique}): {report}")


def test_killed_dvc_repro_during_critique_resumes_with_dvc_repro(critique_setup, tmp_path):
    run, server, unique = critique_setup["run"], critique_setup["server"], critique_setup["unique"]
    project = tmp_path / "project"
    shutil.copytree(run["project"], project, symlinks=True)
    original = {t: table_rows(project / f"data/{t}/round=0001", t) for t in ("annotations", "ppo_steps")}
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["critic"]["cache_dir"] = "cache/critic-fresh"  # a param change: critique re-runs, all misses
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    critiqued = sum(r["critiqued"] for r in original["annotations"])
    point = random.Random(SEED + 1).randrange(1, critiqued)
    start_count = server.stats()["completions"]
    process = start([sys.executable, "-m", "dvc", "repro"], project)
    assert wait_until(lambda: server.stats()["completions"] - start_count >= point, 120, process), \
        process.communicate()[1][-2000:]
    kill_group(process)
    for lock in (project / ".dvc" / "tmp").glob("*lock"):  # a killed dvc leaves its repo lock behind
        lock.unlink()
    assert_whole_or_absent(project / "data/annotations/round=0001")
    cached = cache_entries(project / "cache/critic-fresh")
    before = settled_requests(server)
    result = run_logged([sys.executable, "-m", "dvc", "repro"], project)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    resent = server.stats()["requests"] - before
    assert resent == critiqued - cached, (resent, critiqued, cached)
    for table, rows in original.items():
        got = table_rows(project / f"data/{table}/round=0001", table)
        assert got == rows, table
    print(f"\ndvc repro killed after {point} completions: cached {cached}, re-sent {resent} of {critiqued}")


def settled_requests(server, quiet_s: float = 1.0) -> int:
    """The server's request count once it has stopped moving: a request the killed process wrote just before
    SIGKILL can still sit in the socket buffer and be counted after the kill, and it must not count as re-sent."""
    count = server.stats()["requests"]
    while True:
        time.sleep(quiet_s)
        now = server.stats()["requests"]
        if now == count:
            return count
        count = now


@pytest.fixture(scope="module")
def ppo_reference(tmp_path_factory):
    run = shrunken_run()
    out = tmp_path_factory.mktemp("ppo-ref")
    started = time.monotonic()
    result = run_logged(ppo_cmd(run["project"], out), run["project"])
    assert result.returncode == 0, result.stderr[-2000:]
    return {"run": run, "out": out, "seconds": time.monotonic() - started}


def checkpoint(out):
    model = load_file(str(out / "model" / "model.safetensors"))
    return model, json.loads((out / "model" / "trainer_state.json").read_text())


def test_killed_ppo_resumes_to_the_uninterrupted_result(ppo_reference, tmp_path):
    run, reference = ppo_reference["run"], ppo_reference["out"]
    expected_steps = table_rows(reference / "steps", "ppo_steps")
    expected_model, expected_state = checkpoint(reference)
    rng = random.Random(SEED)
    points = sorted(round(rng.uniform(0.45, 0.98) * ppo_reference["seconds"], 2) for _ in range(3))
    outcomes = []
    for i, point in enumerate(points):
        out = tmp_path / f"kill{i}"
        process = start(ppo_cmd(run["project"], out), run["project"])
        time.sleep(point)
        finished_first = process.poll() is not None
        kill_group(process)
        assert_whole_or_absent(out / "steps")
        written = [name for name in ("model/model.safetensors", "model/trainer_state.json", "steps/part-0.parquet")
                   if (out / name).exists()]
        outcomes.append((point, "finished" if finished_first else "killed", written))
        result = run_logged(ppo_cmd(run["project"], out), run["project"])
        assert result.returncode == 0, result.stderr[-2000:]
        assert table_rows(out / "steps", "ppo_steps") == expected_steps
        model, state = checkpoint(out)
        assert state == expected_state
        assert model.keys() == expected_model.keys()
        assert all(model[k].equal(expected_model[k]) for k in model)
    print(f"\nppo uninterrupted {ppo_reference['seconds']:.1f}s; kill points (s, outcome, files present at kill): {outcomes}")
