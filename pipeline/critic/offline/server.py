"""A local OpenAI-compatible chat-completions server with seeded fault injection.

The offline modes of drlc answer critic requests through this server, so the production
client path (HTTP, JSON, retries, cache) runs even without network access. It is built on
the standard library only (:class:`http.server.ThreadingHTTPServer`, one thread per
connection, HTTP/1.1 keep-alive) and binds 127.0.0.1 unless told otherwise.

Endpoints:

- ``POST /v1/chat/completions`` answers with the backend's text in OpenAI's response shape.
  Token counts are whitespace word counts, except for the ``hf`` backend, which counts
  tokenizer tokens. Bodies over 1 MiB get 413, malformed ones (including a ``max_tokens``
  that is not a positive integer) 400.
- ``GET /v1/models`` lists the one model the server answers as.
- ``GET /stats`` returns counters: requests, completions, rejected, faults by kind, and the device
  of the backend's model (null for a backend without one).

Backends: ``tagger`` (a span tagger distilled by `drlc critic distill`, in ``model_dir``; see
:mod:`pipeline.critic.offline.tagger_backend`), ``random_spans`` (the random-span control: that
tagger's spans moved to random places, :mod:`pipeline.critic.offline.random_spans`), ``lexicon``
(the offline lexicon critic; ``layout`` picks its layout, one of
:data:`pipeline.critic.offline.lexicon.LAYOUTS`), ``echo`` (repeats the last user message),
``hf`` (a local causal LM checkpoint in ``model_dir``, loaded once per server;
see :mod:`pipeline.critic.offline.hf_backend`) or any callable ``messages -> text``.
``lexicon`` and ``hf`` honour ``critic.answer_format``'s fields (a ``json_schema``
``response_format``, ``drlc_copy``): the lexicon writes its spans as drlc's span JSON, the hf
backend decodes under the constraint; a ``grammar`` the hf backend cannot read is an error.

Faults are drawn per chat request from ``random.Random(seed)`` in arrival order (so the
sequence repeats exactly for sequential clients): ``error`` (500), ``rate_limit`` (429
with ``Retry-After: 1``), ``garbage`` (200 with a truncated JSON body), ``drop`` (the
connection closes without a response) and ``empty`` (200 with empty content).
``latency_s`` delays every chat request, faulty or not.
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from collections import Counter
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Iterator

from pipeline.core.config import CRITIC_BACKENDS as BACKENDS
from pipeline.core.errors import ConfigError, CriticError
from pipeline.critic.offline.protocol import AnswerFn, CompleteFn, Completion, content_text

__all__ = ["BACKENDS", "FAULT_KINDS", "Completion", "make_server", "serve_in_background", "serve_forever"]

FAULT_KINDS = ("error", "rate_limit", "garbage", "drop", "empty")
MODEL_DIR_BACKENDS = ("hf", "tagger", "random_spans", "rules")  # the backends that read model_dir
MAX_BODY_BYTES = 1 << 20
_MAX_DRAIN_BYTES = 16 << 20

def _echo_answer(messages: list[dict]) -> str:
    """Answer with the last user message (for tests of the transport)."""
    user = [m for m in messages if m.get("role") == "user"]
    return content_text((user or messages)[-1].get("content"))


def _word_count_completion(answer: AnswerFn) -> CompleteFn:
    """Wrap a ``messages -> text`` backend so it returns a :class:`Completion` counted in words."""
    def complete(request: dict) -> Completion:
        text = answer(request["messages"])
        return Completion(text=text, prompt_tokens=_prompt_words(request["messages"]),
                          completion_tokens=len(text.split()))
    return complete


def _prompt_words(messages: list[dict]) -> int:
    return sum(len(content_text(m.get("content")).split()) for m in messages)


def _resolve_backend(backend: str | AnswerFn, model_dir: str | None,
                     layout: str = "drlc", device=None, labels=None) -> tuple[str, CompleteFn]:
    """Return (name, request -> Completion) for a backend name or a callable ``messages -> text``."""
    if layout != "drlc" and backend != "lexicon":
        raise CriticError(f"critic server layout (--layout) {layout!r} is only used by "
                          f"backend 'lexicon', not {backend!r}; drop it or use --backend lexicon")
    if backend not in MODEL_DIR_BACKENDS and model_dir is not None:
        raise CriticError(f"critic server model_dir (--model-dir) is only used by backends {list(MODEL_DIR_BACKENDS)}, "
                          f"not {backend!r}; drop it or use one of those backends")
    if callable(backend):
        return getattr(backend, "__name__", "custom"), _word_count_completion(backend)
    if backend == "echo":
        return "echo", _word_count_completion(_echo_answer)
    if backend == "lexicon":
        from pipeline.critic.offline import lexicon

        if layout not in lexicon.LAYOUTS:
            raise CriticError(f"unknown lexicon layout {layout!r}; valid: {list(lexicon.LAYOUTS)}")

        def lexicon_complete(request: dict) -> Completion:
            text = lexicon.complete(request, layout=layout)
            return Completion(text=text, prompt_tokens=_prompt_words(request["messages"]),
                              completion_tokens=len(text.split()))

        return "lexicon", lexicon_complete
    if backend == "hf":
        if model_dir is None:
            raise CriticError("critic server backend 'hf' needs model_dir (--model-dir DIR): "
                              "a folder with a causal LM checkpoint and a tokenizer with a chat template")
        from pipeline.critic.offline.hf_backend import HFBackend

        return "hf", HFBackend(model_dir, device=device)
    if backend == "rules":
        if model_dir is None:
            raise CriticError("critic server backend 'rules' needs model_dir (--model-dir FILE): the Python file "
                              "that defines critic(query, response), e.g. your task file")
        from pipeline.critic.offline.rules import RuleBackend

        return "rules", _word_count_completion(RuleBackend(model_dir, labels=labels))
    if backend in ("tagger", "random_spans"):
        if model_dir is None:
            raise CriticError(f"critic server backend {backend!r} needs model_dir (--model-dir DIR): "
                              "a folder written by `drlc critic distill`")
        from pipeline.critic.offline.tagger_backend import RandomSpanBackend, TaggerBackend

        cls = TaggerBackend if backend == "tagger" else RandomSpanBackend
        return backend, cls(model_dir, labels=labels)
    raise CriticError(f"unknown critic server backend {backend!r}; valid: {list(BACKENDS)}")


def _check_rates(rates: dict[str, float]) -> None:
    for kind, rate in rates.items():
        if not 0.0 <= rate <= 1.0:
            raise ConfigError(f"critic server {kind}_rate={rate!r} is out of range; use a value in [0, 1]")
    if sum(rates.values()) > 1.0:
        raise ConfigError(f"critic server fault rates sum to {sum(rates.values()):g} > 1; lower some of {rates}")


class _CriticServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the default listen backlog of 5 drops SYNs of a burst: +1 s per retransmit

    def __init__(self, address, *, backend_name: str, complete_fn: CompleteFn, latency_s: float,
                 rates: dict[str, float], seed: int):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)
        self.backend_name, self.complete_fn = backend_name, complete_fn
        self.latency_s, self.rates = latency_s, rates
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    @property
    def base_url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://[{host}]:{port}/v1" if ":" in host else f"http://{host}:{port}/v1"

    def draw_fault(self) -> tuple[int, str | None]:
        """Count one chat request; return its number and fault kind (None = answer normally)."""
        with self._lock:
            self._counts["requests"] += 1
            number = self._counts["requests"]
            draw, edge = self._rng.random(), 0.0
            for kind in FAULT_KINDS:
                edge += self.rates[kind]
                if draw < edge:
                    self._counts[f"fault:{kind}"] += 1
                    return number, kind
            return number, None

    def count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def stats(self) -> dict:
        with self._lock:
            counts = dict(self._counts)
        return {
            "requests": counts.get("requests", 0),
            "completions": counts.get("completions", 0),
            "rejected": counts.get("rejected", 0),
            "faults": {kind: counts.get(f"fault:{kind}", 0) for kind in FAULT_KINDS},
            "device": getattr(self.complete_fn, "device", None),  # the hf model's; None for a backend without one
        }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _CriticServer

    def log_message(self, format: str, *args: object) -> None:  # quiet: /stats has the counts
        pass

    def setup(self) -> None:
        super().setup()
        # headers and body leave in two writes; with Nagle on, the body waits for the client's
        # delayed ACK of the headers, which adds ~40 ms to every response on Linux loopback
        if self.connection.family in (socket.AF_INET, socket.AF_INET6):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _send_json(self, status: int, payload: object, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(payload).encode("utf-8")
        self._send_bytes(status, body, headers)

    def _send_bytes(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _reject(self, status: int, message: str, *, close: bool = False) -> None:
        self.server.count("rejected")
        if close:
            self.close_connection = True
        self._send_json(status, {"error": {"message": message, "type": "invalid_request_error", "code": status}},
                        {"Connection": "close"} if close else None)

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/v1/models":
            model = {"id": f"drlc-{self.server.backend_name}", "object": "model", "created": 0, "owned_by": "drlc"}
            self._send_json(200, {"object": "list", "data": [model]})
        elif self.path.rstrip("/") == "/stats":
            self._send_json(200, self.server.stats())
        else:
            self._reject(404, f"no route GET {self.path}; try /v1/models or /stats")

    def do_POST(self) -> None:
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._reject(404, f"no route POST {self.path}; use /v1/chat/completions", close=True)
            return
        request = self._read_request()
        if request is None:
            return
        number, fault = self.server.draw_fault()
        if self.server.latency_s > 0:
            time.sleep(self.server.latency_s)
        if fault == "drop":
            self.close_connection = True  # the handler returns without writing: the socket just closes
            return
        if fault == "error":
            self._send_json(500, {"error": {"message": "injected server error", "type": "server_error"}})
            return
        if fault == "rate_limit":
            self._send_json(429, {"error": {"message": "injected rate limit", "type": "rate_limit_error"}},
                            {"Retry-After": "1"})
            return
        self._answer(request, fault, number)

    def _read_request(self) -> dict | None:
        """Read and validate the JSON body; send a 4xx and return None if it is unusable."""
        length_header = self.headers.get("Content-Length")
        if length_header is None or not length_header.isdigit():
            self._reject(411, "a Content-Length header is required", close=True)
            return None
        length = int(length_header)
        if length > MAX_BODY_BYTES:
            if length <= _MAX_DRAIN_BYTES:  # read it so the client sees the 413, not a reset
                for start in range(0, length, 1 << 16):
                    self.rfile.read(min(1 << 16, length - start))
            self._reject(413, f"request body of {length_header} bytes exceeds {MAX_BODY_BYTES} bytes", close=True)
            return None
        try:
            request = json.loads(self.rfile.read(length).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            self._reject(400, f"request body is not JSON: {error}")
            return None
        messages = request.get("messages") if isinstance(request, dict) else None
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            self._reject(400, "request needs a non-empty 'messages' list of objects")
            return None
        for name in ("max_tokens", "max_completion_tokens"):
            limit = request.get(name)
            if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
                self._reject(400, f"{name}={limit!r} is not a positive integer")
                return None
        return request

    def _answer(self, request: dict, fault: str | None, number: int) -> None:
        try:
            answer = Completion("", _prompt_words(request["messages"]), 0) if fault == "empty" \
                else self.server.complete_fn(request)
        except Exception as error:  # a backend bug must reach the client as a 500, not a hang
            self.server.count("backend_errors")
            self._send_json(500, {"error": {"message": f"backend failed: {error}", "type": "server_error"}})
            return
        prompt_tokens, completion_tokens = answer.prompt_tokens, answer.completion_tokens
        payload = {
            "id": f"chatcmpl-drlc-{number}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": str(request.get("model") or f"drlc-{self.server.backend_name}"),
            "system_fingerprint": f"drlc-{self.server.backend_name}",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer.text},
                         "finish_reason": answer.finish_reason, "logprobs": None}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        }
        body = json.dumps(payload).encode("utf-8")
        if fault == "garbage":
            self._send_bytes(200, body[: len(body) // 2])
            return
        if fault is None:
            self.server.count("completions")
        self._send_bytes(200, body)


def make_server(*, host: str = "127.0.0.1", port: int = 0, backend: str | AnswerFn = "lexicon",
                latency_s: float = 0.0, error_rate: float = 0.0, rate_limit_rate: float = 0.0,
                garbage_rate: float = 0.0, drop_rate: float = 0.0, empty_rate: float = 0.0,
                seed: int = 0, model_dir: str | None = None, layout: str = "drlc",
                device=None, labels: tuple[str, ...] | None = None) -> _CriticServer:
    """Create (bind, not start) a critic server; ``port=0`` picks a free port.

    :param host: interface to bind (loopback by default)
    :param port: TCP port, 0 for any free one
    :param backend: "lexicon" (offline critic), "echo" (repeats the last user message), "hf"
        (the checkpoint in ``model_dir``, loaded here, once) or a callable ``messages -> text``
    :param latency_s: delay added to every chat request
    :param error_rate, rate_limit_rate, garbage_rate, drop_rate, empty_rate: fault
        probabilities per chat request, each in [0, 1], summing to at most 1
    :param seed: seed of the fault draws
    :param model_dir: checkpoint folder of the "hf" backend or model folder of the "tagger" and "random_spans" backends;
        must be ``None`` for the others
    :param layout: layout of the "lexicon" backend's answers (drlc, paper, markdown, messy);
        must be "drlc" for the others
    :param device: where the "hf" backend's model runs (None: the CPU); the other backends have no model
    :param labels: the labels the "tagger" (and "random_spans") backend's model must tag (None: any); checked at start
    :return: a server with ``base_url``, ``stats()``, ``serve_forever()``, ``shutdown()``
    :raises CriticError: on an unknown backend or layout, "hf" without a loadable
        ``model_dir``, or a ``model_dir`` or layout given to another backend
    :raises ConfigError: on a fault rate out of range
    :raises CriticError: if host:port cannot be bound (in use, out of range, not a local address)
    """
    rates = {"error": error_rate, "rate_limit": rate_limit_rate, "garbage": garbage_rate,
             "drop": drop_rate, "empty": empty_rate}
    _check_rates(rates)
    if latency_s < 0:
        raise ConfigError(f"critic server latency_s={latency_s!r} is negative; use a value >= 0")
    backend_name, complete_fn = _resolve_backend(backend, model_dir, layout, device, labels)  # fail before binding a port
    try:
        return _CriticServer((host, port), backend_name=backend_name, complete_fn=complete_fn,
                             latency_s=latency_s, rates=rates, seed=seed)
    except (OSError, OverflowError) as error:  # port in use or out of range, host not on this machine
        raise CriticError(f"critic server cannot listen on {host}:{port} ({error}); pick a free port in "
                          "1-65535 (--port, 0 = any free one) on an address of this machine (--host)") from None


@contextmanager
def serve_in_background(**options) -> Iterator[tuple[str, Callable[[], dict]]]:
    """Run a server in a daemon thread of this process for the duration of a ``with`` block.

    A thread (not a subprocess) keeps start-up to milliseconds and lets the caller read the
    counters directly; other processes can still reach it over TCP while the block runs.

    :param options: the keyword arguments of :func:`make_server`
    :return: (base URL like ``"http://127.0.0.1:PORT/v1"``, function returning ``/stats``)
    """
    server = make_server(**options)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              name="drlc-critic-server", daemon=True)
    thread.start()
    try:
        yield server.base_url, server.stats
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def serve_forever(**options) -> None:
    """Run a server in the foreground until Ctrl-C (``drlc critic serve``).

    :param options: the keyword arguments of :func:`make_server`
    """
    server = make_server(**options)
    print(f"drlc critic server ({server.backend_name}) listening on {server.base_url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
