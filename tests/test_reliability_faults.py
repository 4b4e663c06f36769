"""API faults: the critique stage survives a 30% fault rate and loses nothing it paid for.

The stage runs on the tables of one finished shrunken run against a loopback critic server
injecting 30% faults per attempt: 500s, 429 with Retry-After, truncated JSON bodies, dropped
connections and (from the backend) answers slower than critic.timeout_s. Then:
run 1 completes with every critiqued row ok or api_error with its reason and no failure cached;
run 2 (faults still on) sends only the rows that failed; run 3 (faults off, same port so the
same cache keys) sends exactly the rows still failed and ends with every row ok.
"""
import json
import random
import threading
import time

import pyarrow.parquet as pq
import pytest
from reliability import critic_server, critique_cmd, free_port, run_logged, shrunken_run, workdir_for

from pipeline.core.cache import CriticCache
from pipeline.critic.offline import lexicon

pytestmark = pytest.mark.slow  # each builds a finished run with dvc repro (shrunken_run)

RATE = 0.06  # per fault kind; five kinds = 30% of attempts
HANG_S = 2.5
REASONS = ("timeout", "http_500", "http_429", "bad_body", "connection_error")


class SlowSometimes:
    """A lexicon backend that hangs past the client timeout on a seeded share of calls."""

    __name__ = "lexicon-slow"

    def __init__(self, rate: float, seed: int = 0):
        self.rate, self.rng, self.lock, self.hangs = rate, random.Random(seed), threading.Lock(), 0

    def __call__(self, messages):
        with self.lock:
            hang = self.rng.random() < self.rate
            self.hangs += hang
        if hang:
            time.sleep(HANG_S)
        return lexicon.answer(messages)


def critique_once(project, workdir, port, name, **server_options):
    out, metrics = workdir / name, workdir / f"{name}.json"
    with critic_server(port=port, **server_options) as server:
        result = run_logged(critique_cmd(project, out, metrics), workdir, workdir / "logs.txt")
        stats = server.stats()
    assert result.returncode == 0, result.stderr[-3000:]
    rows = pq.read_table(out / "part-0.parquet").to_pylist()  # with cache_hit, a volatile column
    return [r for r in rows if r["critiqued"]], stats, json.loads(metrics.read_text())


def faulty_options(seed: int):
    return dict(backend=SlowSometimes(RATE / (1 - 4 * RATE), seed), seed=seed, error_rate=RATE,
                rate_limit_rate=RATE, garbage_rate=RATE, drop_rate=RATE)


def test_critique_survives_30_percent_faults_and_resends_only_failures(tmp_path):
    run = shrunken_run()
    project = run["project"]
    workdir = workdir_for(tmp_path, run["params"], endpoint=f"http://127.0.0.1:{(port := free_port())}/v1",
                          cache_dir=str(tmp_path / "cache"), threshold=1.0, max_retries=1, timeout_s=1.0,
                          max_concurrency=8, max_error_rate=1.0)  # the health gate has its own test

    rows1, stats1, metrics1 = critique_once(project, workdir, port, "run1", **(options := faulty_options(1)))
    faults1 = sum(stats1["faults"].values()) + options["backend"].hangs
    unique = {r["cache_key"] for r in rows1}
    assert len(rows1) == 64 and faults1 >= 10, (len(rows1), stats1)
    assert {r["status"] for r in rows1} <= {"ok", "none", "api_error", "parse_error"}
    failed1 = {r["cache_key"] for r in rows1 if r["status"] == "api_error"}
    for row in rows1:
        if row["status"] == "api_error":
            assert any(reason in row["error"] for reason in REASONS), row["error"]
            assert row["raw_text"] == "" and not any(row["token_rewards"]), row
    with CriticCache(tmp_path / "cache") as cache:
        cached = set(cache.keys())
    assert cached == unique - failed1  # every answer kept, no failure cached
    assert metrics1["status_api_error"] == len([r for r in rows1 if r["status"] == "api_error"])

    rows2, stats2, _ = critique_once(project, workdir, port, "run2", **(options := faulty_options(2)))
    faults2 = sum(stats2["faults"].values()) + options["backend"].hangs
    sent2 = {r["cache_key"] for r in rows2 if not r["cache_hit"]}
    assert sent2 == failed1  # only what failed is asked again
    assert len(failed1) <= stats2["requests"] <= 2 * len(failed1)  # one retry each at most
    failed2 = {r["cache_key"] for r in rows2 if r["status"] == "api_error"}

    rows3, stats3, _ = critique_once(project, workdir, port, "run3")
    assert stats3["requests"] == len(failed2) and sum(stats3["faults"].values()) == 0
    assert {r["status"] for r in rows3} <= {"ok", "none"}, [r["error"] for r in rows3 if r["status"] != "ok"]
    assert any(r["status"] == "ok" for r in rows3)
    assert {r["cache_key"] for r in rows3 if not r["cache_hit"]} == failed2
    print(f"\nfaults injected: run1 {faults1} ({stats1['faults']}, hangs {faults1 - sum(stats1['faults'].values())}) "
          f"over {stats1['requests']} requests; run2 {faults2} over {stats2['requests']}; "
          f"unique {len(unique)}, failed after run1 {len(failed1)}, after run2 {len(failed2)}, run3 sent "
          f"{stats3['requests']}")
