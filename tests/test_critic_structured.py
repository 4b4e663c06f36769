"""critic.answer_format text/json/copy/copy_words: requests, cache keys, reading, and the real loopback path per format."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from test_critic_annotate import REWARDS, TEMPLATE, rows, tokenizer

from pipeline.core.errors import ConfigError
from pipeline.critic.annotate import annotate_round
from pipeline.critic.client import CriticClient
from pipeline.critic.offline.server import serve_in_background
from pipeline.critic.structured import MAX_SPANS, read_structured, request_body, shape_requests, span_schema

FAST = {"model": "critic-m", "backoff_base_s": 0.005, "backoff_max_s": 1.0, "timeout_s": 5.0}
LABELS = ("positive", "negative")


def annotate(client, cache, answer_format):
    return annotate_round(rows(), template=TEMPLATE, tokenizer=tokenizer(), client=client, cache=cache,
                          threshold=0.0, rewards=REWARDS, alignment="exact", progress=False,
                          answer_format=answer_format)


@pytest.mark.parametrize("answer_format", ["text", "json", "copy", "copy_words"])
def test_each_format_runs_over_loopback_and_keeps_the_same_spans(cache, answer_format):
    """The lexicon backend honours each format; the kept spans are the same, the answers differ in form."""
    with serve_in_background(backend="lexicon") as (url, _):
        out = annotate(CriticClient(base_url=url, **FAST), cache, answer_format)
    first = out[0]
    assert [a["status"] for a in out] == ["ok", "skipped", "none", "ok", "ok"]
    assert {(s["label"], s["text"]) for s in first["spans"]} == {("negative", "awful"), ("negative", "boring")}
    if answer_format == "text":
        assert first["raw_text"] == 'Positive: none\nNegative: "awful"; "boring"'
    else:
        assert json.loads(first["raw_text"]) == {"spans": [{"label": "negative", "text": "awful"},
                                                           {"label": "negative", "text": "boring"}]}


def test_text_format_keeps_todays_requests_and_keys():
    requests = [TEMPLATE.render({"response": "so good"})]
    shaped, bodies = shape_requests(requests, ["so good"], labels=LABELS, answer_format="text")
    assert shaped == requests and bodies == [{}]
    client = CriticClient(base_url="http://127.0.0.1:9/v1", **FAST)
    assert client.key_for(requests[0]) == client.key_for(requests[0], body={})


def test_format_schema_grammar_and_extra_body_are_in_the_cache_key():
    messages = TEMPLATE.render({"response": "so good"})
    client = CriticClient(base_url="http://127.0.0.1:9/v1", **FAST)
    json_body = request_body("json", LABELS, source="so good")
    copy_body = request_body("copy", LABELS, source="so good")
    other_copy = request_body("copy", LABELS, source="so bad")
    words_body = request_body("copy_words", LABELS, source="so good")
    keys = {client.key_for(messages), client.key_for(messages, body=json_body),
            client.key_for(messages, body=copy_body), client.key_for(messages, body=other_copy),
            client.key_for(messages, body=words_body),
            CriticClient(base_url="http://127.0.0.1:9/v1", extra_body={"repeat_penalty": 1.0},
                         **FAST).key_for(messages)}
    assert len(keys) == 6
    with pytest.raises(ConfigError, match=r"critic.extra_body sets \['temperature'\]"):
        CriticClient(base_url="http://127.0.0.1:9/v1", extra_body={"temperature": 1}, **FAST)


def test_json_body_is_openai_strict_schema_and_copy_body_has_no_response_format():
    body = request_body("json", LABELS, source="x")
    assert body["response_format"]["type"] == "json_schema" and body["response_format"]["json_schema"]["strict"]
    schema = body["response_format"]["json_schema"]["schema"]
    assert schema == span_schema(LABELS) and schema["properties"]["spans"]["maxItems"] == MAX_SPANS
    assert schema["properties"]["spans"]["items"]["properties"]["label"]["enum"] == list(LABELS)
    copy = request_body("copy", LABELS, source="x")
    assert "response_format" not in copy and copy["grammar"].startswith("root ::= ")
    assert copy["drlc_copy"] == {"source": "x", "labels": list(LABELS), "max_spans": MAX_SPANS}
    words = request_body("copy_words", LABELS, source="x, y")
    assert words["drlc_copy"] == {"source": "x, y", "labels": list(LABELS), "max_spans": MAX_SPANS, "words": True}
    assert "text ::= s0 | s3" in words["grammar"] and "s1 ::=" in words["grammar"]  # spans start at x or y only
    with pytest.raises(ConfigError, match="critic.answer_format 'yaml' is unknown"):
        request_body("yaml", LABELS, source="x")


def test_the_instruction_is_appended_to_the_last_user_message_only():
    requests = [TEMPLATE.render({"response": "so good"})]
    shaped, _ = shape_requests(requests, ["so good"], labels=LABELS, answer_format="copy")
    assert shaped[0][0] == requests[0][0]  # the system message is unchanged
    assert shaped[0][-1]["content"].startswith(requests[0][-1]["content"].rstrip())
    added = shaped[0][-1]["content"][len(requests[0][-1]["content"].rstrip()):]
    assert '"positive" or "negative"' in added and '{"spans": []}' in added


@pytest.mark.parametrize("text, status, spans", [
    ('{"spans": [{"label": "negative", "text": "awful"}]}', "ok", [("negative", "awful")]),
    ('```json\n{"spans": [{"label": "Negative", "text": "awful"}]}\n```', "ok", [("negative", "awful")]),
    ('{"spans": []}', "none", []),
    ('{"spans": [{"label": "negative"}]}', "parse_error", []),
    ('{"verdict": "bad"}', "parse_error", []),
    ('{"spans": [{"label": "negative", "text": "aw', "parse_error", []),  # cut JSON, no free-text item
    ('Negative: "awful"', "ok", [("negative", "awful")]),  # not JSON: the free-text fallback reads it
])
def test_read_structured(text, status, spans):
    parsed = read_structured(text, labels=LABELS)
    assert parsed.status == status and list(parsed.spans) == spans
    if status == "parse_error":
        assert parsed.error  # never silently empty


def test_cut_json_error_names_json():
    parsed = read_structured('{"spans": [{"label": "negative", "text": "aw', labels=LABELS)
    assert parsed.error.startswith("not valid JSON")


class _Refuse(BaseHTTPRequestHandler):
    """A chat endpoint that refuses response_format like llama.cpp's server (HTTP 500) and counts posts."""

    status, message, posts = 500, "Unsupported response_format type: json_schema", 0

    def log_message(self, *args):
        pass

    def do_POST(self):
        type(self).posts += 1
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps({"error": {"message": self.message, "type": "server_error"}}).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.mark.parametrize("status, message, fix", [
    (500, "Unsupported response_format type: json_schema", "critic.answer_format: copy"),
    (400, "response_format is not supported by this model", "critic.answer_format: copy"),
])
def test_an_endpoint_refusing_response_format_fails_once_with_one_line(cache, status, message, fix):
    handler = type("Refuse", (_Refuse,), {"status": status, "message": message, "posts": 0})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        client = CriticClient(base_url=url, max_retries=5, server="llamacpp", **FAST)  # llama.cpp-like: no /models
        messages = TEMPLATE.render({"response": "so good"})
        result = client.run([messages], cache, bodies=[request_body("json", LABELS, source="so good")])[0]
        plain = client.run([messages], cache)[0]  # the same 500 without response_format is retried
    finally:
        server.shutdown()
        server.server_close()
    assert result.status == "api_error" and result.attempts == 1
    assert "\n" not in result.error and "critic.answer_format" in result.error and fix in result.error
    assert result.error.startswith(f"answer_format_refused: http_{status}")
    assert plain.status == "api_error" and (plain.attempts == 6 if status == 500 else plain.attempts == 1)
    assert "answer_format" not in plain.error


def test_config_checks_answer_format_and_voting(tmp_path):
    from pipeline.core.config import load_params

    root = Path(__file__).resolve().parents[1]
    base = (root / "params.yaml").read_text()
    path = tmp_path / "params.yaml"
    path.write_text(base)
    assert load_params(path).critic.answer_format == "text" and load_params(path).critic.samples == 1
    with pytest.raises(ConfigError, match="answer_format"):
        load_params(path, ["critic.answer_format=yaml"])
    with pytest.raises(ConfigError, match=r"'critic.samples' = 3 at 'critic.temperature' = 0"):
        load_params(path, ["critic.samples=3", "critic.temperature=0"])
    with pytest.raises(ConfigError, match=r"'critic.vote_min' = 4 exceeds 'critic.samples' = 3"):
        load_params(path, ["critic.samples=3", "critic.temperature=0.7", "critic.vote_min=4"])
    assert load_params(path, ["critic.samples=3", "critic.temperature=0.7"]).critic.samples == 3
