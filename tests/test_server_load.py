"""The local critic server as `drlc critic serve` runs it: loopback bind, bounded load, 4xx on bad bodies."""
import http.client
import json
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from reliability import stage_env

REQUESTS, CONCURRENCY, TIME_BOUND_S = 2000, 32, 60.0


@pytest.fixture(scope="module")
def served():
    """`python -m pipeline critic serve --port 0` (echo backend): (host, port, process)."""
    process = subprocess.Popen([sys.executable, "-m", "pipeline", "critic", "serve", "--port", "0",
                                "--backend", "echo"], env=stage_env(), stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    match = re.search(r"listening on http://([^:/]+):(\d+)/v1", line)
    assert match, line
    yield match.group(1), int(match.group(2)), process
    process.terminate()
    process.wait(timeout=10)


def post(connection, body: bytes, headers=None):
    connection.request("POST", "/v1/chat/completions", body=body,
                       headers={"Content-Type": "application/json", **(headers or {})})
    response = connection.getresponse()
    return response.status, response.read()


def test_binds_loopback_by_default(served):
    host, port, _ = served
    assert host == "127.0.0.1"
    listening = [line.split()[1] for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
                 if line.split()[3] == "0A" and line.split()[1].endswith(f":{port:04X}")]
    assert listening == [f"0100007F:{port:04X}"], listening  # 127.0.0.1 only, not 0.0.0.0


def worker(host, port, indices):
    connection = http.client.HTTPConnection(host, port, timeout=30)
    failures = []
    for i in indices:
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": f"load {i}"}]}).encode()
        status, raw = post(connection, body)
        if status != 200 or json.loads(raw)["choices"][0]["message"]["content"] != f"load {i}":
            failures.append((i, status))
    connection.close()
    return failures


def stats(host, port):
    connection = http.client.HTTPConnection(host, port, timeout=10)
    connection.request("GET", "/stats")
    return json.loads(connection.getresponse().read())


def test_2000_requests_at_concurrency_32_without_errors(served):
    host, port, _ = served
    before = stats(host, port)["completions"]
    started = time.monotonic()
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        failures = sum(pool.map(lambda k: worker(host, port, range(k, REQUESTS, CONCURRENCY)), range(CONCURRENCY)), [])
    seconds = time.monotonic() - started
    assert failures == [] and seconds < TIME_BOUND_S, (failures[:5], seconds)
    assert stats(host, port)["completions"] - before == REQUESTS
    print(f"\n{REQUESTS} requests at concurrency {CONCURRENCY}: {seconds:.1f}s, {REQUESTS / seconds:.0f} req/s, 0 errors")


@pytest.mark.parametrize("body, headers, status", [
    (b"x" * ((1 << 20) + 1), None, 413),
    (b"{not json", None, 400),
    (b"\xff\xfe", None, 400),
    (b"[]", None, 400),
    (b'{"messages": []}', None, 400),
    (b'{"messages": ["hi"]}', None, 400),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}', None, 400),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": true}', None, 400),
])
def test_oversized_or_malformed_bodies_get_4xx(served, body, headers, status):
    host, port, process = served
    got, raw = post(http.client.HTTPConnection(host, port, timeout=30), body, headers)
    assert got == status, raw
    assert "error" in json.loads(raw)
    assert process.poll() is None


def test_missing_content_length_gets_411(served):
    host, port, _ = served
    connection = http.client.HTTPConnection(host, port, timeout=10)
    connection.putrequest("POST", "/v1/chat/completions")
    connection.endheaders()
    assert connection.getresponse().status == 411
