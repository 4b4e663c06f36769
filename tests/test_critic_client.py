"""Critic client through a real server on 127.0.0.1: concurrency, retries, faults, budgets, keys."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from test_critic_cache import RUN_SNIPPET

from pipeline.core.cache import CriticCache
from pipeline.core.errors import ConfigError, CriticError
from pipeline.critic.client import CriticClient
from pipeline.critic.offline.server import serve_in_background

FAST = dict(model="critic-m", backoff_base_s=0.005, backoff_max_s=1.0, timeout_s=5.0)


def requests_for(count, prefix="text"):
    return [[{"role": "user", "content": f"{prefix} number {i}"}] for i in range(count)]


def test_answers_come_back_in_order_and_are_cached(cache):
    with serve_in_background(backend="echo") as (url, stats):
        client = CriticClient(base_url=url, **FAST)
        first = client.run(requests_for(5), cache)
        second = client.run(requests_for(5), cache)
        assert stats()["requests"] == 5
    assert [r.raw_text for r in first] == [f"text number {i}" for i in range(5)]
    assert all(r.status == "ok" and not r.cache_hit and r.attempts == 1 for r in first)
    assert all(r.cache_hit and r.cost_usd == 0.0 for r in second)
    assert [r.raw_text for r in second] == [r.raw_text for r in first]
    assert client.last_stats.cache_hits == 5 and client.last_stats.requests_sent == 0
    assert cache.stats()["requests"] == 5 and cache.stats()["entries"] == 5


@RUN_SNIPPET  # the child: a snippet run in a child process (slow) or, in the unit tier, in this one
def test_answers_paid_in_one_process_are_hits_in_another(tmp_path, run_snippet):
    child = (
        "import sys\n"
        "from pipeline.core.cache import CriticCache\n"
        "from pipeline.critic.client import CriticClient\n"
        "requests = [[{'role': 'user', 'content': f'text number {i}'}] for i in range(8)]\n"
        "with CriticCache(sys.argv[2]) as cache:\n"
        "    results = CriticClient(base_url=sys.argv[1], model='critic-m').run(requests, cache)\n"
        "print(sum(r.status == 'ok' and not r.cache_hit for r in results))\n"
    )
    with serve_in_background(backend="echo") as (url, stats):
        code, stdout, stderr = run_snippet(child, url, str(tmp_path / "shared"))
        assert code == 0, stderr
        assert stdout.strip() == "8" and stats()["requests"] == 8
        with CriticCache(tmp_path / "shared") as cache:
            results = CriticClient(base_url=url, **FAST).run(requests_for(8), cache)
            totals = cache.stats()
        assert stats()["requests"] == 8  # nothing new was sent
    assert all(r.cache_hit for r in results) and [r.raw_text for r in results] == [f"text number {i}" for i in range(8)]
    assert (totals["requests"], totals["hits"], totals["misses"]) == (8, 8, 8)


def test_identical_requests_are_sent_once_and_paid_once(cache):
    with serve_in_background(backend="echo") as (url, stats):
        client = CriticClient(base_url=url, prices={"critic-m": (1e6, 1e6)}, **FAST)
        results = client.run(requests_for(3) * 3, cache)
        assert stats()["requests"] == 3
    # echo: 3 prompt words + 3 completion words at $1 per token -> $6 each, paid once per unique request
    assert [r.cost_usd for r in results] == [6.0] * 3 + [0.0] * 6
    assert [r.raw_text for r in results] == [f"text number {i}" for i in range(3)] * 3


def test_requests_overlap_up_to_max_concurrency(cache):
    in_flight, peak, lock = [0], [0], threading.Lock()

    def slow_echo(messages):
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        time.sleep(0.2)
        with lock:
            in_flight[0] -= 1
        return messages[-1]["content"]

    with serve_in_background(backend=slow_echo) as (url, _):
        client = CriticClient(base_url=url, max_concurrency=8, **FAST)
        started = time.perf_counter()
        results = client.run(requests_for(16), cache)
        wall = time.perf_counter() - started
    print(f"16 requests x 0.2 s at concurrency 8: {wall:.3f} s, peak in flight {peak[0]}")
    assert all(r.status == "ok" for r in results)
    assert peak[0] == 8  # the overlap is the property; its speed is benchmarks/critic_throughput.py's (load varies)
    assert wall >= 0.4  # 16 requests of 0.2 s through 8 slots: at least two waves, never more at once


@pytest.mark.parametrize("kind", ["error", "garbage", "drop", "empty"])
def test_each_fault_kind_is_retried_until_success(cache, kind):
    with serve_in_background(backend="echo", seed=1, **{f"{kind}_rate": 0.4}) as (url, stats):
        client = CriticClient(base_url=url, max_concurrency=4, max_retries=10, **FAST)
        results = client.run(requests_for(20), cache)
        counts = stats()
    assert all(r.status == "ok" and r.raw_text for r in results)
    assert counts["faults"][kind] > 0
    assert client.last_stats.retries == counts["faults"][kind]  # every injected fault cost one retry
    assert sum(r.attempts for r in results) == counts["requests"] == client.last_stats.requests_sent


def test_rate_limit_waits_for_retry_after(cache):
    with serve_in_background(backend="echo", seed=3, rate_limit_rate=0.5) as (url, stats):
        client = CriticClient(base_url=url, max_concurrency=1, max_retries=10, **FAST)
        started = time.perf_counter()
        results = client.run(requests_for(3), cache)
        wall = time.perf_counter() - started
        limited = stats()["faults"]["rate_limit"]
    assert all(r.status == "ok" for r in results) and limited >= 1
    assert wall >= 1.0 * limited  # each 429 says Retry-After: 1, requests run one at a time


def test_retry_after_beyond_backoff_max_fails_at_once_and_is_not_cached(cache):
    with serve_in_background(backend="echo", rate_limit_rate=1.0) as (url, _):
        client = CriticClient(base_url=url, **(FAST | {"backoff_max_s": 0.5}))
        started = time.perf_counter()
        (result,) = client.run(requests_for(1), cache)
    assert time.perf_counter() - started < 0.9
    assert result.status == "api_error" and "retry_after" in result.error and result.attempts == 1
    assert cache.stats()["entries"] == 0


def test_timeout_is_retried_then_recorded_not_cached(cache):
    with serve_in_background(backend="echo", latency_s=0.6) as (url, stats):
        client = CriticClient(base_url=url, **(FAST | {"timeout_s": 0.2, "max_retries": 1}))
        (result,) = client.run(requests_for(1), cache)
        assert stats()["requests"] == 2
    assert result.status == "api_error" and result.error.startswith("timeout") and result.attempts == 2
    assert cache.stats()["entries"] == 0


def test_failures_are_never_cached_and_are_retried_next_run(cache):
    with serve_in_background(backend="echo", error_rate=1.0) as (url, stats):
        client = CriticClient(base_url=url, **(FAST | {"max_retries": 2}))
        for _ in range(2):
            results = client.run(requests_for(2), cache)
            assert all(r.status == "api_error" and r.error.startswith("http_500") for r in results)
        assert stats()["requests"] == 2 * 2 * 3
    assert cache.stats()["entries"] == 0 and client.last_stats.failures == 2


def test_no_request_lost_under_30_percent_mixed_faults(cache):
    faults = dict(error_rate=0.07, rate_limit_rate=0.03, garbage_rate=0.07, drop_rate=0.07, empty_rate=0.06)
    with serve_in_background(backend="echo", seed=11, **faults) as (url, stats):
        client = CriticClient(base_url=url, max_concurrency=16, max_retries=15, **FAST)
        started = time.perf_counter()
        results = client.run(requests_for(500), cache)
        wall = time.perf_counter() - started
        counts = stats()
    print(f"500 requests, faults {counts['faults']} (total {sum(counts['faults'].values())}), "
          f"retries {client.last_stats.retries}, wall {wall:.2f} s")
    assert [r.status for r in results].count("ok") == 500
    assert [r.raw_text for r in results] == [f"text number {i}" for i in range(500)]
    assert sum(counts["faults"].values()) > 100 and client.last_stats.retries == sum(counts["faults"].values())
    assert cache.stats()["entries"] == 500


def test_max_requests_budget_stops_cleanly(cache):
    with serve_in_background(backend="echo") as (url, stats):
        client = CriticClient(base_url=url, max_concurrency=2, max_requests=5, **FAST)
        results = client.run(requests_for(10), cache)
        assert stats()["requests"] == 5
    assert [r.status for r in results] == ["ok"] * 5 + ["budget"] * 5
    assert all("max_requests=5" in r.error for r in results[5:])
    assert cache.stats()["entries"] == 5 and client.last_stats.budget_stopped == 5


def test_max_cost_budget_stops_before_overspending(cache):
    # each echo request: 3 prompt + 3 completion words at $1 per token = $6; budget $13 allows two
    with serve_in_background(backend="echo") as (url, _):
        client = CriticClient(base_url=url, max_concurrency=1, prices={"critic-m": (1e6, 1e6)},
                              max_cost_usd=13.0, **FAST)
        results = client.run(requests_for(5), cache)
    assert [r.status for r in results] == ["ok", "ok", "budget", "budget", "budget"]
    assert client.last_stats.cost_usd == 12.0 and cache.stats()["entries"] == 2


def test_api_key_rules(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(CriticError, match="OPENAI_API_KEY"):
        CriticClient(base_url="https://api.openai.com/v1", model="gpt-4o-mini")
    for loopback in ("http://127.0.0.1:9/v1", "http://localhost:9/v1", "http://[::1]:9/v1"):
        CriticClient(base_url=loopback, model="m")
    for bad in ("api.openai.com/v1", "ftp://host/v1", "http://:80/v1", "http://host:port/v1"):
        with pytest.raises(CriticError, match="critic.endpoint"):
            CriticClient(base_url=bad, model="m")
    with pytest.raises(ConfigError, match="temprature"):
        CriticClient(base_url="http://127.0.0.1:9/v1", model="m", sampling={"temprature": 0})


def test_api_key_changes_no_key_and_never_reaches_disk_or_errors(cache, tmp_path, monkeypatch):
    secret = "sk-drlc-test-SECRET-0123456789"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    with serve_in_background(backend="echo", seed=2, error_rate=0.3, drop_rate=0.2) as (url, _):
        client = CriticClient(base_url=url, max_retries=1, **FAST)
        results = client.run(requests_for(20), cache)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-other")
        other = CriticClient(base_url=url, **FAST)
    assert [client.key_for(m) for m in requests_for(3)] == [other.key_for(m) for m in requests_for(3)]
    assert secret not in repr(client) and all(secret not in r.error for r in results)
    cache.close()
    files = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert files and not any(secret.encode() in p.read_bytes() for p in files)


class _CutOffHandler(BaseHTTPRequestHandler):
    """A chat-completions endpoint that cuts off (finish_reason "length") answers to messages with "long"."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        text = request["messages"][-1]["content"]
        self.server.received.append(text)
        cut = "long" in text
        body = json.dumps({
            "id": "x", "object": "chat.completion", "created": 0, "model": request["model"],
            "choices": [{"index": 0, "finish_reason": "length" if cut else "stop",
                         "message": {"role": "assistant", "content": "Positive: the" if cut else text}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        }).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_finish_reason_length_is_truncated_paid_not_retried_and_cached_as_truncated(cache):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _CutOffHandler)
    server.received = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = CriticClient(base_url=f"http://127.0.0.1:{server.server_address[1]}/v1",
                              prices={"critic-m": (1e6, 1e6)}, **FAST)
        requests = [[{"role": "user", "content": "short one"}], [{"role": "user", "content": "a long one"}]]
        first = client.run(requests, cache)
        second = client.run(requests, cache)
    finally:
        server.shutdown()
        server.server_close()
    ok, cut = first
    assert ok.status == "ok" and ok.raw_text == "short one"
    assert (cut.status, cut.raw_text, cut.finish_reason, cut.attempts) == ("truncated", "Positive: the", "length", 1)
    assert "raise critic.max_tokens" in cut.error and cut.cost_usd == 5.0  # paid: 3 + 2 tokens at $1 each
    assert set(cache.keys()) == {ok.cache_key, cut.cache_key}
    assert [r.status for r in second] == ["ok", "truncated"] and all(r.cache_hit for r in second)
    assert second[1].raw_text == "Positive: the" and "raise critic.max_tokens" in second[1].error
    assert sorted(server.received) == ["a long one", "short one"]  # the re-run sends nothing
    assert (client.last_stats.truncated, client.last_stats.cache_hits, client.last_stats.requests_sent) == (0, 2, 0)
    bigger = CriticClient(base_url="http://127.0.0.1:9/v1", sampling={"max_tokens": 512}, **FAST)
    assert bigger.key_for(requests[1]) != cut.cache_key  # raising max_tokens asks again


def test_cache_hits_count_every_request_answered_from_the_cache(cache):
    with serve_in_background(backend="echo") as (url, stats):
        client = CriticClient(base_url=url, **FAST)
        client.run(requests_for(2), cache)
        client.run(requests_for(3) * 2, cache)  # 2 cached keys asked twice each, 1 new key asked twice
        assert stats()["requests"] == 3
    assert (client.last_stats.cache_hits, client.last_stats.requests_sent) == (4, 1)


def test_keys_ignore_host_and_port_but_not_template_namespace_or_model_id():
    messages = requests_for(1)[0]
    key = CriticClient(base_url="http://127.0.0.1:8000/v1", model="m", template_sha="t").key_for(messages)
    assert key == CriticClient(base_url="http://localhost:9001/v1", model="m", template_sha="t").key_for(messages)
    for other in ({"template_sha": "u"}, {"template_sha": "t", "cache_namespace": "b"},
                  {"template_sha": "t", "model_id": "drlc-local:echo"}):
        assert CriticClient(base_url="http://127.0.0.1:8000/v1", model="m", **other).key_for(messages) != key
