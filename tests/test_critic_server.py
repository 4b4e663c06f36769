"""Local OpenAI-compatible critic server: response shape, bad requests, seeded faults."""

import http.client
import json
import random
from urllib.parse import urlsplit

import pytest

from pipeline.core.errors import ConfigError, CriticError
from pipeline.critic.offline.server import FAULT_KINDS, make_server, serve_in_background

MESSAGES = [{"role": "system", "content": "Task: sentiment"},
            {"role": "user", "content": "the  soup was\nlovely"}]


def post(base_url, body: bytes, path="/v1/chat/completions", headers=None):
    """POST raw bytes with http.client; return (status, headers, body bytes)."""
    parts = urlsplit(base_url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        connection.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def get(base_url, path):
    parts = urlsplit(base_url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def chat_body(messages=MESSAGES, model="critic-m"):
    return json.dumps({"model": model, "messages": messages}).encode()


def test_chat_completion_has_openai_shape_and_word_count_usage():
    with serve_in_background(backend="echo") as (base_url, stats):
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
        status, _, body = post(base_url, chat_body())
        reply = json.loads(body)
    assert status == 200
    assert reply["object"] == "chat.completion" and reply["model"] == "critic-m"
    assert reply["id"] and isinstance(reply["created"], int) and reply["system_fingerprint"]
    assert reply["choices"][0]["message"] == {"role": "assistant", "content": "the  soup was\nlovely"}
    assert reply["choices"][0]["finish_reason"] == "stop"
    # words by hand: "Task:", "sentiment" + "the", "soup", "was", "lovely"
    assert reply["usage"] == {"prompt_tokens": 6, "completion_tokens": 4, "total_tokens": 10}
    assert stats() == {"requests": 1, "completions": 1, "rejected": 0, "faults": dict.fromkeys(FAULT_KINDS, 0),
                       "device": None}


def test_custom_callable_backend_and_models_route():
    with serve_in_background(backend=lambda messages: f"{len(messages)} messages") as (base_url, _):
        assert json.loads(post(base_url, chat_body())[2])["choices"][0]["message"]["content"] == "2 messages"
        status, models = get(base_url, "/v1/models")
    assert status == 200 and models["object"] == "list" and models["data"][0]["object"] == "model"


@pytest.mark.parametrize("body, status", [
    (b"{not json", 400), (b"[1, 2]", 400), (json.dumps({"model": "m"}).encode(), 400),
    (json.dumps({"model": "m", "messages": []}).encode(), 400),
    (json.dumps({"model": "m", "messages": ["hi"]}).encode(), 400),
    (b"{" + b" " * (1 << 20) + b"}", 413),
])
def test_bad_requests_get_a_4xx_json_error(body, status):
    with serve_in_background(backend="echo") as (base_url, stats):
        got, _, reply = post(base_url, body)
        assert stats()["rejected"] == 1 and stats()["completions"] == 0
    assert got == status and "message" in json.loads(reply)["error"]


def test_unknown_route_is_404():
    with serve_in_background(backend="echo") as (base_url, _):
        assert post(base_url, chat_body(), path="/v1/completions")[0] == 404
        assert get(base_url, "/nope")[0] == 404


def test_backend_and_rate_errors():
    with pytest.raises(CriticError, match="lexicon.*echo.*hf"):
        make_server(backend="gpt5")
    with pytest.raises(CriticError, match="model_dir"):
        make_server(backend="hf")
    with pytest.raises(CriticError, match=r"only used by backends \['hf', 'tagger', 'random_spans', 'rules'\]"):
        make_server(backend="echo", model_dir="/tmp")
    with pytest.raises(ConfigError, match="error_rate"):
        make_server(backend="echo", error_rate=1.5)
    with pytest.raises(ConfigError, match="sum"):
        make_server(backend="echo", error_rate=0.6, drop_rate=0.6)


def expected_faults(seed, rates, count):
    """Replay the server's draw independently: one uniform per request, kinds in FAULT_KINDS order."""
    rng, kinds = random.Random(seed), []
    for _ in range(count):
        draw, edge, kind = rng.random(), 0.0, None
        for name in FAULT_KINDS:
            edge += rates[name]
            if draw < edge:
                kind = name
                break
        kinds.append(kind)
    return kinds


def observe(base_url):
    try:
        status, headers, body = post(base_url, chat_body())
    except (http.client.RemoteDisconnected, ConnectionError):
        return "drop"
    if status == 500:
        return "error"
    if status == 429:
        assert headers["Retry-After"] == "1"
        return "rate_limit"
    try:
        content = json.loads(body)["choices"][0]["message"]["content"]
    except json.JSONDecodeError:
        return "garbage"
    return "empty" if content == "" else None


def test_faults_follow_the_seeded_draws_exactly():
    rates = {"error": 0.1, "rate_limit": 0.1, "garbage": 0.1, "drop": 0.1, "empty": 0.1}
    options = {f"{kind}_rate": rate for kind, rate in rates.items()}
    with serve_in_background(backend="echo", seed=7, **options) as (base_url, stats):
        seen = [observe(base_url) for _ in range(60)]
        counts = stats()
    assert seen == expected_faults(7, rates, 60)
    assert counts["faults"] == {kind: seen.count(kind) for kind in FAULT_KINDS}
    assert counts["requests"] == 60 and counts["completions"] == seen.count(None)
    assert all(counts["faults"][kind] > 0 for kind in FAULT_KINDS)


def test_lexicon_backend_answers_a_rendered_template():
    lexicon = pytest.importorskip("pipeline.critic.offline.lexicon")
    from pipeline.critic.templates import load_template

    messages = load_template("prompts/sentiment.md").render({"response": "The food was awful but the staff were kind."})
    with serve_in_background(backend="lexicon") as (base_url, _):
        status, _, body = post(base_url, chat_body(messages))
    assert status == 200
    assert json.loads(body)["choices"][0]["message"]["content"] == lexicon.answer(messages)
