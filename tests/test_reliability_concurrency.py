"""Concurrency: two writers critique overlapping requests through one cache directory at once.

Both run CriticClient (cache first, then the loopback echo server) at the same time on sets
that share half their requests. Afterwards the cache database passes SQLite's integrity check,
holds exactly one answer per distinct request, each the right one, and its shared request
counter equals what the server received (no lost increments).

The writers are two processes, as two stages would be (slow), and, in the unit tier, two threads
of this process, each with its own CriticCache (its own SQLite connection) on the directory.
"""
import json
import sqlite3
import subprocess
import sys
import textwrap
import threading

import pytest
from reliability import critic_server, stage_env

from pipeline.core.cache import CriticCache, cache_key

N_PER_PROCESS, OVERLAP = 240, 120

WORKER = textwrap.dedent("""
    import json, sys
    from pipeline.core.cache import CriticCache
    from pipeline.critic.client import CriticClient

    def work(base_url, cache_dir, first, count, out):
        first, count = int(first), int(count)
        requests = [[{"role": "user", "content": f"request {i}"}] for i in range(first, first + count)]
        client = CriticClient(base_url=base_url, model="m", max_concurrency=8)
        with CriticCache(cache_dir) as cache:
            results = client.run(requests, cache)
        json.dump([[r.status, r.raw_text, r.cache_hit] for r in results], open(out, "w"))

    if __name__ == "__main__":
        work(*sys.argv[1:])
""")


def expected_key(i: int) -> str:
    return cache_key(model="m", messages=[{"role": "user", "content": f"request {i}"}], template_sha="")


def in_processes(argvs: list[list[str]]) -> list[str]:
    """Run WORKER once per argv, in as many processes at once; their stderr (all must exit 0)."""
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, *argv], env=stage_env(), stderr=subprocess.PIPE,
                                text=True) for argv in argvs]
    errors = [w.communicate(timeout=120)[1] for w in workers]
    assert [w.returncode for w in workers] == [0] * len(workers), errors
    return errors


def in_threads(argvs: list[list[str]]) -> list[str]:
    """Run WORKER's work() once per argv, in as many threads of this process at once (all must return)."""
    namespace = {"__name__": "worker"}
    exec(WORKER, namespace)
    errors = [None] * len(argvs)

    def run(n: int, argv: list[str]) -> None:
        try:
            namespace["work"](*argv)
        except Exception as error:  # noqa: BLE001 - reported below, as a worker process's stderr would be
            errors[n] = repr(error)

    threads = [threading.Thread(target=run, args=(n, argv)) for n, argv in enumerate(argvs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads) and errors == [None] * len(argvs), errors
    return errors


@pytest.mark.parametrize("run_workers", [in_threads, pytest.param(in_processes, marks=pytest.mark.slow)],
                         ids=["threads", "processes"])
def test_two_writers_share_one_cache_without_loss_or_corruption(tmp_path, run_workers):
    cache_dir = tmp_path / "cache"
    CriticCache(cache_dir).close()  # both workers open an existing cache, as two stages would
    starts = [0, N_PER_PROCESS - OVERLAP]
    with critic_server(backend="echo", latency_s=0.01) as server:
        run_workers([[server.base_url, str(cache_dir), str(first), str(N_PER_PROCESS), str(tmp_path / f"w{n}.json")]
                     for n, first in enumerate(starts)])
        sent = server.stats()["requests"]
    distinct = range(0, starts[1] + N_PER_PROCESS)
    for n, first in enumerate(starts):
        results = json.loads((tmp_path / f"w{n}.json").read_text())
        assert [(status, text) for status, text, _ in results] == \
            [("ok", f"request {i}") for i in range(first, first + N_PER_PROCESS)]
    assert sqlite3.connect(cache_dir / "cache.db").execute("PRAGMA integrity_check").fetchone() == ("ok",)
    with CriticCache(cache_dir) as cache:
        assert set(cache.keys()) == {expected_key(i) for i in distinct}
        for i in distinct:
            assert cache.get(expected_key(i))["raw_text"] == f"request {i}"
        assert cache.stats()["requests"] == sent
    assert len(distinct) <= sent <= 2 * N_PER_PROCESS
    print(f"\n2 writers x {N_PER_PROCESS} requests ({OVERLAP} shared): {len(distinct)} entries, {sent} sent")
