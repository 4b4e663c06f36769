"""critic_requests has one definition: HTTP attempts sent. A request repeated within one call is sent once, so
its repeats carry attempts = 0 and sum(attempts) over the rows equals the client's requests_sent."""
from pipeline.critic.client import CriticClient
from pipeline.critic.offline.server import serve_in_background

FAST = {"model": "critic-m", "backoff_base_s": 0.005, "backoff_max_s": 1.0, "timeout_s": 5.0}


def requests_for(texts):
    return [[{"role": "user", "content": text}] for text in texts]


def test_a_repeat_within_a_call_is_one_request_and_one_attempt(cache):
    texts = ["a b", "c d", "a b", "e f", "a b", "c d"]
    with serve_in_background(backend="echo") as (url, stats):
        client = CriticClient(base_url=url, **FAST)
        results = client.run(requests_for(texts), cache)
        received = stats()["requests"]
    assert received == 3 == client.last_stats.requests_sent
    assert [r.attempts for r in results] == [1, 1, 0, 1, 0, 0]
    assert sum(r.attempts for r in results) == received
    assert not any(r.cache_hit for r in results)  # a repeat is not a hit of the disk cache


def test_retried_requests_count_every_attempt_and_repeats_none(cache):
    texts = [f"text {i % 4}" for i in range(12)]  # 4 distinct requests, each 3 times
    with serve_in_background(backend="echo", seed=3, error_rate=0.4) as (url, stats):
        client = CriticClient(base_url=url, max_retries=10, **FAST)
        results = client.run(requests_for(texts), cache)
        received = stats()["requests"]
    assert all(r.status == "ok" for r in results)
    assert sum(r.attempts for r in results) == received == client.last_stats.requests_sent
    assert [r.attempts for r in results[4:]] == [0] * 8
    again = client.run(requests_for(texts), cache)
    assert sum(r.attempts for r in again) == client.last_stats.requests_sent == 0
    assert all(r.cache_hit for r in again)
