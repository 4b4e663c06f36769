"""critic.server: the body each server kind gets, auto-detection from GET /v1/models, the check that catches a
server ignoring its constraint, and the wait for a server still starting (pipeline/critic/servers.py, endpoint.py, constraint.py).

The servers here are real stdlib HTTP servers on 127.0.0.1 in a thread: one answers like vLLM (it lists
itself as owned_by vllm, applies `structured_outputs` and ignores a top-level `grammar`, as vLLM does), one
starts listening late. tests/test_critic_vllm.py runs the same properties against a real vLLM server.
"""
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pipeline.core.cache import cache_key
from pipeline.core.config import load_params
from pipeline.core.errors import ConfigError, CriticError
from pipeline.critic.client import CriticClient
from pipeline.critic.constraint import breaks_constraint
from pipeline.critic.endpoint import BREAK_SHARE, detected_kind, ignored_constraint, kind_from_models
from pipeline.critic.servers import body_for
from pipeline.critic.structured import request_body, shape_requests, span_schema, spans_json

LABELS = ("toxic",)
SOURCE = 'You are a "total" clown, mate.'
FAST = {"model": "critic-m", "backoff_base_s": 0.005, "backoff_max_s": 0.5, "timeout_s": 5.0, "max_retries": 1}
RUNAWAY = '{"spans": [{"label": "toxic", "text": {"nested": {"nested": {"nested": '  # unconstrained, cut off


def body(answer_format: str, source: str = SOURCE) -> dict:
    return request_body(answer_format, LABELS, source=source)


# ---- the body per server kind, and the cache key ----

def test_drlc_and_llamacpp_get_the_canonical_body_so_their_cache_keys_are_unchanged():
    for answer_format in ("json", "copy", "copy_words"):
        canonical = body(answer_format)
        assert body_for("drlc", canonical) is canonical and body_for("llamacpp", canonical) is canonical
    messages = [{"role": "user", "content": "hi"}]
    copy = body("copy_words")
    expected = cache_key(model="critic-m", messages=messages, template_sha="", body=copy)  # the key before critic.server
    for server in ("drlc", "llamacpp"):
        client = CriticClient(base_url="http://127.0.0.1:9/v1", server=server, model="critic-m")
        assert client.key_for(messages, body=copy) == expected
    vllm = CriticClient(base_url="http://127.0.0.1:9/v1", server="vllm", model="critic-m")
    assert vllm.key_for(messages, body=copy) != expected  # the body it changes is in its key
    assert vllm.key_for(messages) == CriticClient(base_url="http://127.0.0.1:9/v1", model="critic-m").key_for(messages)


def test_vllm_gets_structured_outputs_and_sglang_ebnf_with_the_same_grammar():
    for answer_format in ("copy", "copy_words"):
        canonical = body(answer_format) | {"repeat_penalty": 1.0}
        assert body_for("vllm", canonical) == {"repeat_penalty": 1.0,
                                               "structured_outputs": {"grammar": canonical["grammar"]}}
        assert body_for("sglang", canonical) == {"repeat_penalty": 1.0, "ebnf": canonical["grammar"]}
    schema = span_schema(LABELS)
    assert body_for("vllm", body("json")) == {"structured_outputs": {"json": schema}}
    for kind in ("sglang", "openai"):
        assert body_for(kind, body("json")) == body("json")  # OpenAI's response_format
    with pytest.raises(ConfigError, match="critic.answer_format: json"):
        body_for("openai", body("copy"))
    assert body_for("vllm", {}) == {} and body_for("vllm", {"repeat_penalty": 1.0}) == {"repeat_penalty": 1.0}


# ---- which server: GET /v1/models ----

@pytest.mark.parametrize("models, kind", [
    ({"object": "list", "data": [{"id": "/m", "object": "model", "owned_by": "vllm", "root": "/m"}]}, "vllm"),
    ({"data": [{"id": "m", "object": "model", "owned_by": "sglang"}]}, "sglang"),
    ({"object": "list", "data": [{"id": "m.gguf", "object": "model", "owned_by": "llamacpp"}]}, "llamacpp"),
    ({"object": "list", "data": [{"id": "m.gguf", "object": "model", "owned_by": "me", "permissions": []}]},
     "llamacpp"),  # llama-cpp-python's server
    ({"data": [{"id": "drlc-hf", "owned_by": "drlc"}]}, "drlc"),
    ({"data": [{"id": "gpt-4o-mini", "owned_by": "system"}]}, "openai"),
    ({"data": [{"id": "x", "owned_by": "acme"}]}, None),
    ({"data": [{"id": "x", "owned_by": "me"}]}, None),
    (None, None),
    ({"detail": "Not Found"}, None),
])
def test_the_server_kind_is_read_from_v1_models(models, kind):
    assert kind_from_models(models) == kind


def test_an_unknown_server_is_one_line_naming_the_setting():
    with pytest.raises(CriticError) as error:
        detected_kind({"data": [{"id": "x", "owned_by": "acme"}]}, "http://127.0.0.1:1/v1")
    assert "\n" not in str(error.value) and "critic.server" in str(error.value) and "['acme']" in str(error.value)
    assert detected_kind({}, "https://api.openai.com/v1") == "openai"


# ---- the check: does an answer keep its constraint? ----

def test_copy_answers_that_copy_from_the_response_keep_the_constraint():
    copy = body("copy_words")
    assert not breaks_constraint(copy, spans_json([("toxic", 'total" clown')], 8), "stop")  # an escaped quote
    assert not breaks_constraint(copy, '{"spans": []}', "stop")
    assert not breaks_constraint(copy, '{"spans": [{"label": "toxic", "text": "total', "length")  # a cut-off prefix
    assert not breaks_constraint(copy, '  {"spans": []}\n', "stop")  # whitespace around it
    assert breaks_constraint(copy, spans_json([("toxic", "idiot")], 8), "stop")  # not in the response
    assert breaks_constraint(copy, spans_json([("toxic", "lown")], 8), "stop")  # half a word: copy_words only
    assert not breaks_constraint(body("copy"), spans_json([("toxic", "lown")], 8), "stop")
    assert breaks_constraint(copy, spans_json([("insult", "clown")], 8), "stop")  # not a label
    assert breaks_constraint(copy, RUNAWAY, "length")
    assert breaks_constraint(copy, '{"spans": [{"label": "toxic", "text": "clown"}', "stop")  # never closed
    assert breaks_constraint(copy, "Sure! The toxic span is clown.", "stop")
    blank = spans_json([("toxic", " ")], 8)  # in the copy grammar, refused by the automaton: checked exactly
    assert not breaks_constraint(body("copy"), blank, "stop") and breaks_constraint(copy, blank, "stop")
    assert breaks_constraint(body("copy"), blank.replace(", ", ","), "stop")  # not the grammar's layout


def test_json_answers_are_checked_against_the_schema():
    schema = body("json")
    assert not breaks_constraint(schema, '{"spans":[{"label":"toxic","text":"anything"}]}', "stop")
    assert not breaks_constraint(schema, '{ "spans" : [ {"label": "toxic", "text": "any', "length")
    assert not breaks_constraint(schema, '{"sp', "length")
    assert breaks_constraint(schema, '{"spans": [{"label": "toxic", "text": "x", "why": "y"}]}', "stop")
    assert breaks_constraint(schema, json.dumps({"spans": [{"label": "toxic", "text": "x"}] * 9}), "stop")
    assert breaks_constraint(schema, "```json\n{\"spans\": []}\n```", "stop")
    assert breaks_constraint(schema, "Here are the spans: {", "length")
    assert breaks_constraint(schema, RUNAWAY, "length")  # a cut-off answer must be a prefix of one of the schema
    assert breaks_constraint(schema, '{"spans": [{"label": "insult", "te', "length")
    assert not breaks_constraint(schema, '{"spans": [{"text": "a \\"b\\"", "label": "toxic"}, {"lab', "length")
    assert not breaks_constraint({}, "free text", "stop")  # no constraint, nothing to break


# ---- real loopback servers ----

class _VLLMLike(BaseHTTPRequestHandler):
    """Answers as vLLM does to drlc's bodies: `structured_outputs` applied, any other field ignored.

    With a grammar or schema it writes the empty answer (in every copy grammar's and the schema's language);
    without one, what SmolLM2 writes unconstrained: a runaway JSON cut at max_tokens.
    """

    owned_by, bodies = "vllm", []

    def log_message(self, *args):
        pass

    def _send(self, payload):
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send({"object": "list", "data": [{"id": "critic-m", "object": "model", "owned_by": self.owned_by}]})

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(request)
        honoured = "structured_outputs" in request
        text, finish = ('{"spans": []}', "stop") if honoured else (RUNAWAY, "length")
        self._send({"id": "x", "object": "chat.completion", "created": 0, "model": "critic-m",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                 "finish_reason": finish}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}})


def serve(handler, port: int = 0):
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


@pytest.fixture
def vllm_like():
    handler = type("VLLMLike", (_VLLMLike,), {"bodies": []})
    server = serve(handler)
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", handler
    server.shutdown()
    server.server_close()


def copy_requests(count: int = 4):
    sources = [f"{SOURCE} Number {i}." for i in range(count)]
    return shape_requests([[{"role": "user", "content": f"Critique: {s}"}] for s in sources], sources,
                          labels=LABELS, answer_format="copy_words")


def test_auto_finds_vllm_and_sends_structured_outputs(cache, vllm_like):
    url, handler = vllm_like
    requests, bodies = copy_requests()
    client = CriticClient(base_url=url, **FAST)
    results = client.run(requests, cache, bodies=bodies)
    assert client.kind == "vllm" and [r.status for r in results] == ["ok"] * 4
    assert all(r.raw_text == '{"spans": []}' for r in results)
    sent = handler.bodies
    assert len(sent) == 4 and all("grammar" not in b and "drlc_copy" not in b for b in sent)
    # concurrent requests arrive in any order
    assert sorted(b["structured_outputs"]["grammar"] for b in sent) == sorted(b["grammar"] for b in bodies)
    again = CriticClient(base_url=url, **FAST).run(requests, cache, bodies=bodies)  # from the cache, same keys
    assert all(r.cache_hit for r in again) and len(handler.bodies) == 4


@pytest.mark.parametrize("answer_format", ["copy_words", "json"])
def test_a_server_ignoring_the_constraint_stops_the_call_in_one_line(cache, vllm_like, answer_format):
    """critic.server forced to llamacpp against a vLLM-like server: the top-level grammar is ignored."""
    url, handler = vllm_like
    requests, _ = copy_requests()
    bodies = [request_body(answer_format, LABELS, source=SOURCE) for _ in requests]
    client = CriticClient(base_url=url, server="llamacpp", **FAST)
    with pytest.raises(CriticError) as error:
        client.run(requests, cache, bodies=bodies)
    line = str(error.value)
    assert "\n" not in line and line.startswith("critic.server: 4 of 4 answers") and "'llamacpp'" in line
    assert "set critic.server" in line and "vllm" in line
    assert cache.stats()["entries"] == 4  # nothing paid for is lost: the answers are cached under what was sent
    with pytest.raises(CriticError, match="critic.server: 4 of 4"):  # and a re-run from the cache stops again
        CriticClient(base_url=url, server="llamacpp", **FAST).run(requests, cache, bodies=bodies)
    assert len(handler.bodies) == 4


def test_a_server_set_as_drlc_must_be_drlcs_own(cache, vllm_like):
    """drlc's own server is trusted unchecked, so critic.server: drlc is first checked against GET /v1/models."""
    url, handler = vllm_like
    requests, bodies = copy_requests(2)
    with pytest.raises(CriticError) as error:
        CriticClient(base_url=url, server="drlc", **FAST).run(requests, cache, bodies=bodies)
    assert "\n" not in str(error.value) and "models says vllm: set critic.server: auto" in str(error.value)
    assert handler.bodies == []  # stopped before a request was sent


def test_the_threshold_lets_one_odd_answer_in_twenty_pass_and_stops_at_more():
    bodies = [body("copy_words")] * 20 + [{}] * 5  # the last 5 carry no constraint: not counted
    good, bad = ('{"spans": []}', "stop"), (RUNAWAY, "length")
    assert BREAK_SHARE == 0.05
    assert ignored_constraint(bodies, [bad] + [good] * 19 + [bad] * 5, kind="vllm", base_url="u") == ""
    line = ignored_constraint(bodies, [bad, bad] + [good] * 23, kind="vllm", base_url="u")
    assert line.startswith("critic.server: 2 of 20 answers from u break") and "structured_outputs" in line


def test_a_client_that_sends_nothing_cannot_guess_the_server(cache):
    requests, bodies = copy_requests(1)
    client = CriticClient(base_url="http://127.0.0.1:9/v1", max_requests=0, **FAST)
    with pytest.raises(CriticError, match="set critic.server to the server that answered") as error:
        client.run(requests, cache, bodies=bodies)
    assert "\n" not in str(error.value)
    text_only = client.run([[{"role": "user", "content": "hi"}]], cache)  # a text answer needs no server kind
    assert text_only[0].status == "budget"


def refusing_socket() -> socket.socket:
    """A socket bound to a loopback port and not listening: connections to it are refused, and no other
    process can take the port meanwhile."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


def listen_late(sock: socket.socket, handler) -> ThreadingHTTPServer:
    """Start serving on `sock`, the port a client was already refused on."""
    server = ThreadingHTTPServer(sock.getsockname(), handler, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    server.server_activate()  # listen(): from here on connections are accepted
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


def test_a_server_that_starts_late_is_waited_for(cache, capsys):
    sock = refusing_socket()
    port = sock.getsockname()[1]
    handler = type("Late", (_VLLMLike,), {"bodies": []})
    started = []
    timer = threading.Timer(0.6, lambda: started.append(listen_late(sock, handler)))
    timer.start()
    try:
        requests, bodies = copy_requests(2)
        client = CriticClient(base_url=f"http://127.0.0.1:{port}/v1", server="vllm", connect_wait_s=20, **FAST)
        t0 = time.monotonic()
        results = client.run(requests, cache, bodies=bodies)
        waited = time.monotonic() - t0
    finally:
        timer.join()
        for server in started:
            server.shutdown()
        sock.close()
    assert [r.status for r in results] == ["ok", "ok"] and 0.5 < waited < 10
    err = capsys.readouterr().err
    assert err.count("waiting up to 20 s") == 1 and "critic.connect_wait_s" in err


def test_no_wait_is_the_default_and_a_wait_is_bounded(cache):
    with refusing_socket() as sock:
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        requests, bodies = copy_requests(1)
        with pytest.raises(CriticError, match=r"refuses connections .* \(critic.connect_wait_s = 0: no wait\)"):
            CriticClient(base_url=url, **FAST).run(requests, cache, bodies=bodies)  # auto: asks /v1/models, at once
        t0 = time.monotonic()
        with pytest.raises(CriticError, match="after waiting critic.connect_wait_s = 0.6 s") as error:
            CriticClient(base_url=url, connect_wait_s=0.6, **FAST).run([[{"role": "user", "content": "x"}]], cache)
        assert 0.5 < time.monotonic() - t0 < 5 and "\n" not in str(error.value)


def test_config_refuses_a_server_that_cannot_be_behind_the_endpoint(tmp_path):
    root = Path(__file__).resolve().parents[1]
    path = tmp_path / "params.yaml"
    path.write_text((root / "params.yaml").read_text())
    assert load_params(path).critic.server == "auto" and load_params(path).critic.connect_wait_s == 0
    with pytest.raises(ConfigError, match="'critic.endpoint' = local is drlc's own server"):
        load_params(path, ["critic.server=vllm"])
    with pytest.raises(ConfigError, match="openai takes none"):
        load_params(path, ["critic.endpoint=https://api.openai.com/v1", "critic.server=openai",
                           "critic.answer_format=copy_words"])
    with pytest.raises(ConfigError, match="critic.server"):
        load_params(path, ["critic.server=tgi"])
    with pytest.raises(ConfigError, match="critic.connect_wait_s"):
        load_params(path, ["critic.connect_wait_s=-1"])


# ---- drlc critic serve --engine vllm (the command; tests/test_critic_vllm.py starts it) ----

def test_the_vllm_command_runs_the_api_server_module_on_loopback(tmp_path):
    from pipeline.critic.vllm_server import vllm_command

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    command = vllm_command(tmp_path / "m", port=8123, enforce_eager=True, python="py")
    assert command[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]  # the vllm console script fails
    assert " ".join(command[3:]) == (f"--model {tmp_path / 'm'} --host 127.0.0.1 --port 8123 --served-model-name m "
                                     f"--gpu-memory-utilization 0.2 --max-model-len 4096 --enforce-eager")
    with pytest.raises(CriticError, match="not a model folder with a config.json"):
        vllm_command(tmp_path, port=1)


def test_critic_serve_engine_vllm_errors_are_one_line(tmp_path, capsys):
    from pipeline.commands.cli import main

    for argv, expected in [
        (["--model-dir", str(tmp_path)], "is not a model folder with a config.json"),
        ([], "needs --model-dir DIR"),
        (["--model-dir", str(tmp_path), "--backend", "hf"], "--backend set options of drlc's own server"),
    ]:
        with pytest.raises(SystemExit) as code:
            main(["critic", "serve", "--engine", "vllm", *argv])
        err = capsys.readouterr().err
        assert code.value.code == 2 and err.count("\n") == 1 and expected in err, err
