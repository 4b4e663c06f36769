"""The Perspective client against a real HTTP server on 127.0.0.1: rate limit, retries, cache, key handling."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from pipeline.core.errors import ConfigError, CriticError
from pipeline.rewards.perspective import API_KEY_ENV, PerspectiveToxicity

KEY = "sekret-key-123"


class FakePerspective:
    """Scores a text as len(text) / 100; fails the first `failures` requests with `status`."""

    def __init__(self):
        self.requests, self.failures, self.status = [], 0, 429
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append({"t": time.monotonic(), "key": parse_qs(urlparse(self.path).query).get("key"),
                                      "text": body["comment"]["text"]})
                if fake.failures > 0:
                    fake.failures -= 1
                    self.send_response(fake.status)
                    self.end_headers()
                    return
                value = len(body["comment"]["text"]) / 100
                payload = json.dumps({"attributeScores": {"TOXICITY": {"summaryScore": {"value": value}}}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1alpha1/comments:analyze"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def fake():
    server = FakePerspective()
    yield server
    server.server.shutdown()


@pytest.fixture
def client(fake, tmp_path, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, KEY)
    return PerspectiveToxicity(cache_dir=str(tmp_path / "cache"), endpoint=fake.url, rate_limit_per_s=20.0,
                               backoff_s=0.01)


def test_scores_then_cache_hits_on_repeat_and_the_key_is_never_stored(client, fake, tmp_path):
    texts = ["abc", "abcdefghij", "abc"]
    assert client.toxicity(texts) == pytest.approx([0.03, 0.10, 0.03])
    assert len(fake.requests) == 2 and all(r["key"] == [KEY] for r in fake.requests)
    assert client.toxicity(texts) == pytest.approx([0.03, 0.10, 0.03])
    assert len(fake.requests) == 2  # every answer came from the cache
    for file in Path(tmp_path / "cache").rglob("*"):
        if file.is_file():
            assert KEY.encode() not in file.read_bytes(), file


def test_rate_limit_spaces_request_starts(client, fake):
    client.interval = 0.2  # 5 requests per second
    client.toxicity(["a", "bb", "ccc", "dddd"])
    starts = [r["t"] for r in fake.requests]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert len(gaps) == 3 and min(gaps) >= 0.18, gaps


def test_429_and_5xx_are_retried_then_succeed(client, fake):
    fake.failures, fake.status = 2, 429
    assert client.toxicity(["hello"]) == pytest.approx([0.05])
    assert len(fake.requests) == 3
    fake.failures, fake.status = 1, 503
    assert client.toxicity(["hello!"]) == pytest.approx([0.06])
    assert len(fake.requests) == 5


def test_client_errors_are_not_retried_and_do_not_leak_the_key(client, fake):
    fake.failures, fake.status = 5, 400
    with pytest.raises(CriticError) as info:
        client.toxicity(["x"])
    assert len(fake.requests) == 1 and "HTTP 400" in str(info.value) and KEY not in str(info.value)


def test_retries_give_up_after_max_retries(client, fake):
    client.max_retries = 2
    fake.failures, fake.status = 10, 500
    with pytest.raises(CriticError, match="3 attempt"):
        client.toxicity(["y"])
    assert len(fake.requests) == 3


def test_missing_key_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    with pytest.raises(ConfigError, match=API_KEY_ENV):
        PerspectiveToxicity(cache_dir=str(tmp_path))
