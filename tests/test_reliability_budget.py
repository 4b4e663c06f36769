"""Disk and budget: a budget stop keeps everything paid for; an unusable cache dir fails before any call.

critic.max_requests reached mid-stage: the stage exits 2 with one line, writes no table, the
cache keeps every answer received, and a re-run with no limit sends only the rest. A cache
directory under a regular file (unwritable even for root) stops the stage in preflight, and
`drlc check` too, with zero requests sent.
"""
import sys

import pyarrow.parquet as pq
import pytest
from reliability import critic_server, critique_cmd, run_logged, shrunken_run, workdir_for

from pipeline.core.cache import CriticCache

pytestmark = pytest.mark.slow  # each builds a finished run with dvc repro (shrunken_run)

BUDGET = 10


def one_line_error(result, *needles):
    """Exit 2, no traceback, one `drlc: error:` line (beside any progress bar) holding every needle."""
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("drlc: error:")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert all(needle in lines[0] for needle in needles), lines[0]


@pytest.mark.long  # a whole shrunken run, then its re-run
def test_budget_stop_keeps_answers_and_rerun_sends_only_the_rest(tmp_path):
    run = shrunken_run()
    cache_dir = tmp_path / "cache"
    out, metrics = tmp_path / "out", tmp_path / "m.json"
    with critic_server(port=run["port"]) as server:
        workdir = workdir_for(tmp_path / "w1", run["params"], cache_dir=str(cache_dir), threshold=1.0,
                              max_requests=BUDGET)
        stopped = run_logged(critique_cmd(run["project"], out, metrics), workdir)
        one_line_error(stopped, f"critic.max_requests={BUDGET}", "raise the budget")
        assert not out.exists() and not metrics.exists()
        assert server.stats()["requests"] == BUDGET
        with CriticCache(cache_dir) as cache:
            assert sum(1 for _ in cache.keys()) == BUDGET
        workdir = workdir_for(tmp_path / "w2", run["params"], cache_dir=str(cache_dir), threshold=1.0,
                              max_requests=None)
        resumed = run_logged(critique_cmd(run["project"], out, metrics), workdir)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        rows = [r for r in pq.read_table(out / "part-0.parquet").to_pylist() if r["critiqued"]]
        unique = {r["cache_key"] for r in rows}
        assert server.stats()["requests"] == len(unique)  # BUDGET before + only the rest now
        assert sum(r["cache_hit"] for r in rows) >= BUDGET and {r["status"] for r in rows} <= {"ok", "none"}
    print(f"\nbudget {BUDGET} of {len(unique)} unique requests; re-run sent {len(unique) - BUDGET}")


def test_cache_dir_under_a_file_fails_in_preflight_before_any_call(tmp_path):
    run = shrunken_run()
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a regular file")
    out, metrics = tmp_path / "out", tmp_path / "m.json"
    with critic_server(port=run["port"]) as server:
        workdir = workdir_for(tmp_path / "w", run["params"], cache_dir=str(blocker / "sub"))
        result = run_logged(critique_cmd(run["project"], out, metrics), workdir)
        one_line_error(result, "critic.cache_dir", str(blocker / "sub"), "not a directory", "writable directory")
        assert server.stats()["requests"] == 0
    assert not out.exists() and not metrics.exists()
    check = run_logged([sys.executable, "-m", "pipeline", "check"], workdir)
    one_line_error(check, "critic.cache_dir", "not a directory")
