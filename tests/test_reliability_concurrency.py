"""Concurrency: two processes critique overlapping requests through one cache directory at once.

Both run CriticClient (cache first, then the loopback echo server) at the same time on sets
that share half their requests. Afterwards the cache database passes SQLite's integrity check,
holds exactly one answer per distinct request, each the right one, and its shared request
counter equals what the server received (no lost increments).
"""
import json
import sqlite3
import subprocess
import sys
import textwrap

from reliability import critic_server, stage_env

from pipeline.core.cache import CriticCache, cache_key

N_PER_PROCESS, OVERLAP = 240, 120

WORKER = textwrap.dedent("""
    import json, sys
    from pipeline.core.cache import CriticCache
    from pipeline.critic.client import CriticClient
    base_url, cache_dir, first, count, out = sys.argv[1:]
    first, count = int(first), int(count)
    requests = [[{"role": "user", "content": f"request {i}"}] for i in range(first, first + count)]
    client = CriticClient(base_url=base_url, model="m", max_concurrency=8)
    with CriticCache(cache_dir) as cache:
        results = client.run(requests, cache)
    json.dump([[r.status, r.raw_text, r.cache_hit] for r in results], open(out, "w"))
""")


def expected_key(i: int) -> str:
    return cache_key(model="m", messages=[{"role": "user", "content": f"request {i}"}], template_sha="")


def test_two_processes_share_one_cache_without_loss_or_corruption(tmp_path):
    cache_dir = tmp_path / "cache"
    CriticCache(cache_dir).close()  # both workers open an existing cache, as two stages would
    starts = [0, N_PER_PROCESS - OVERLAP]
    with critic_server(backend="echo", latency_s=0.01) as server:
        workers = [subprocess.Popen([sys.executable, "-c", WORKER, server.base_url, str(cache_dir), str(first),
                                     str(N_PER_PROCESS), str(tmp_path / f"w{n}.json")],
                                    env=stage_env(), stderr=subprocess.PIPE, text=True)
                   for n, first in enumerate(starts)]
        errors = [w.communicate(timeout=120)[1] for w in workers]
        sent = server.stats()["requests"]
    assert [w.returncode for w in workers] == [0, 0], errors
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
    print(f"\n2 processes x {N_PER_PROCESS} requests ({OVERLAP} shared): {len(distinct)} entries, {sent} sent")
