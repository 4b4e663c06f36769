"""A critic endpoint that cannot be reached stops the call at once, naming the URL; one that answers
with HTTP errors still gets every documented retry (pipeline/critic/client.py, retry policy)."""
import socket
import time

import pytest

from pipeline.core.errors import CriticError
from pipeline.critic.client import CriticClient
from pipeline.critic.offline.server import serve_in_background

FAST = {"model": "critic-m", "backoff_base_s": 0.005, "backoff_max_s": 1.0, "timeout_s": 5.0, "max_retries": 3}


def closed_port() -> int:
    with socket.socket() as s:  # bound then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def requests_for(count):
    return [[{"role": "user", "content": f"text number {i}"}] for i in range(count)]


@pytest.mark.parametrize("url", [f"http://127.0.0.1:{closed_port()}/v1", "https://no-such-host.invalid/v1"],
                         ids=["connection-refused", "dns-failure"])
def test_an_unreachable_endpoint_raises_at_once_naming_the_url(cache, url, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")  # a remote endpoint needs a key before it is tried
    client = CriticClient(base_url=url, max_concurrency=4, **FAST)
    started = time.monotonic()
    with pytest.raises(CriticError) as error:
        client.run(requests_for(8), cache)
    assert time.monotonic() - started < 5
    assert str(error.value).startswith(f"critic endpoint {url} is unreachable (")
    assert "\n" not in str(error.value) and "fix critic.endpoint" in str(error.value)
    assert cache.stats()["entries"] == 0
    assert client.last_stats.retries == 0


def test_an_endpoint_answering_errors_gets_the_documented_retries(cache):
    with serve_in_background(backend="echo", error_rate=1.0) as (url, stats):
        client = CriticClient(base_url=url, max_concurrency=2, **FAST)
        results = client.run(requests_for(3), cache)
        received = stats()["requests"]
    assert [r.status for r in results] == ["api_error"] * 3
    assert [r.attempts for r in results] == [1 + FAST["max_retries"]] * 3
    assert received == client.last_stats.requests_sent == 3 * (1 + FAST["max_retries"])
    assert all(r.error.startswith("http_500") for r in results)
