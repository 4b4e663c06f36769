"""One critic cache for every experiment: workers in two DVC experiment copies, each with the relative
`cache/critic`, write the workspace's one cache at once and lose no answer.

The writers are tests/test_reliability_concurrency.py's WORKER (CriticClient, cache first, then the
loopback echo server), here started in `<project>/.dvc/tmp/exps/<copy>` as DVC starts a queued
experiment: two processes (slow), or in the unit tier two threads, each resolving the relative folder
from its copy with `shared_directory`.
"""
import json
import subprocess
import sys

import pytest
from reliability import critic_server, stage_env
from test_reliability_concurrency import WORKER, expected_key, in_threads

from pipeline.core.cache import CriticCache, link_outside, shared_directory

N, OVERLAP = 60, 30


def in_copies(project, argvs: list[list[str]]) -> None:
    """Run WORKER once per argv at once, each in its own experiment copy of project, as DVC's queue would."""
    copies = [project / ".dvc" / "tmp" / "exps" / name for name in ("tmpa1b2", "standalone/tmpc3d4")]
    for copy in copies:
        copy.mkdir(parents=True)
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, *argv], cwd=copy, env=stage_env(),
                                stderr=subprocess.PIPE, text=True) for copy, argv in zip(copies, argvs)]
    errors = [w.communicate(timeout=120)[1] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], errors


@pytest.mark.parametrize("mode", ["threads", pytest.param("processes", marks=pytest.mark.slow)])
def test_experiment_copies_share_the_workspace_cache_without_loss(tmp_path, mode):
    project = tmp_path / "project"
    starts = [0, N - OVERLAP]
    with critic_server(backend="echo", latency_s=0.01) as server:
        if mode == "processes":  # the relative folder, resolved by each process from its working folder
            in_copies(project, [[server.base_url, "cache/critic", str(first), str(N), str(tmp_path / f"w{n}.json")]
                                for n, first in enumerate(starts)])
        else:
            dirs = [shared_directory("cache/critic", project / ".dvc/tmp/exps" / c) for c in ("tmpa", "standalone/t")]
            assert dirs == [project / "cache" / "critic"] * 2
            in_threads([[server.base_url, str(d), str(first), str(N), str(tmp_path / f"w{n}.json")]
                        for n, (d, first) in enumerate(zip(dirs, starts))])
        sent = server.stats()["requests"]
    assert not any((project / ".dvc/tmp/exps").glob("**/cache"))  # nothing was written inside a copy
    distinct = range(0, starts[1] + N)
    for n, first in enumerate(starts):
        results = json.loads((tmp_path / f"w{n}.json").read_text())
        assert [(status, text) for status, text, _ in results] == [("ok", f"request {i}") for i in
                                                                   range(first, first + N)]
    with CriticCache(project / "cache" / "critic") as cache:
        assert set(cache.keys()) == {expected_key(i) for i in distinct}
        assert all(cache.get(expected_key(i))["raw_text"] == f"request {i}" for i in distinct)
        assert cache.stats()["requests"] == sent


def test_experiment_copies_see_the_folder_beside_the_project(tmp_path):
    project, shared = tmp_path / "project", tmp_path / "shared"
    (shared / "data").mkdir(parents=True)
    project.mkdir()
    link_outside(project)
    for copy in (project / ".dvc/tmp/exps/tmpabc", project / ".dvc/tmp/exps/standalone/tmpdef"):  # queued, --temp
        copy.mkdir()
        assert (copy / ".." / "shared" / "data").is_dir()
    link_outside(project)  # again: nothing to do
    alone = tmp_path / "alone" / "project"
    alone.mkdir(parents=True)
    link_outside(alone)
    assert not (alone / ".dvc").exists()
