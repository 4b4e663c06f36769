"""Async client for an OpenAI-compatible critic endpoint, with cache, retries and budgets.

:class:`CriticClient` answers a list of chat requests. It looks each one up in the
:class:`~pipeline.core.cache.CriticCache` first, sends identical requests once, runs the
misses concurrently (at most ``max_concurrency`` in flight) and stores every complete
answer in the cache as it arrives, so whatever was paid for survives a crash, a budget
stop or a round that fails its error-rate check. The cache's persistent request counter
is added once per call (a SQLite commit per attempt was measurable); a killed process
leaves it short by that call's requests.

Retry policy (drlc's own; the ``openai`` package runs with ``max_retries=0``):

- retried with exponential backoff and jitter: timeouts, connection errors (including a
  dropped connection), HTTP 408, 409, 429 and 5xx, a 200 whose body is not valid JSON or
  not a chat completion, and a 200 with empty content (``empty_content``);
- a ``Retry-After`` (or ``retry-after-ms``) header is honoured exactly when it is at most
  ``backoff_max_s``; a longer one fails that request at once (``retry_after ... >
  backoff_max_s``) instead of stalling the round;
- not retried: other 4xx and ``content_filter``;
- a request that carries ``response_format``, ``grammar``, ``structured_outputs`` or ``ebnf``
  (``critic.answer_format`` json/copy)
  and is answered with a 4xx, or with a 5xx whose message names ``response_format``,
  ``json_schema`` or ``grammar`` (llama.cpp's server answers OpenAI's ``json_schema`` type with
  HTTP 500), fails at once with one line naming ``critic.answer_format`` and the fix.
- an endpoint that cannot be reached at all (connection refused, DNS failure) before it has
  answered anything in this call raises CriticError naming the URL at once, instead of
  retrying every request into a dead port; once it has answered, connection errors are retried.
  With ``connect_wait_s`` > 0 (``critic.connect_wait_s``, for a server that is still starting) the
  first request that must be sent waits instead, up to that long, for ``GET /models`` to answer
  (connections refused, or HTTP 503 while a model loads), saying once on stderr that it waits.

Server kinds (``server``, ``critic.server``; :mod:`pipeline.critic.servers`, detected, confirmed and
checked by :mod:`pipeline.critic.endpoint`): the per-request bodies
given to :meth:`CriticClient.run` are drlc's canonical ones (``response_format``, ``grammar`` +
``drlc_copy``); the client rewrites a constrained body into the fields its server takes (vLLM's
``structured_outputs``, SGLang's ``ebnf``) and keys the cache by the body it sends. ``auto`` asks
``GET /models`` which server it is, once per client, and only when a body is constrained. After the
answers arrive, more than :data:`~pipeline.critic.endpoint.BREAK_SHARE` of them breaking their
constraint (the server ignored it) raises CriticError in one line naming ``critic.server``; the
answers stay cached under the body that was sent.

Per-request body fields (``bodies`` of :meth:`CriticClient.run`) and ``extra_body`` (the same
fields for every request, ``critic.extra_body``) are sent as given and are part of the cache key.

Failures are returned as ``status="api_error"`` results and never cached. An answer cut
off by ``max_tokens`` (``finish_reason == "length"``) is returned with
``status="truncated"`` and its partial text. It is not retried (the same request would be
cut off again) but it is cached like a complete answer, so a re-run sends nothing and gets the
same ``truncated`` status from the cache; ``max_tokens`` is part of the cache key, so raising
``critic.max_tokens`` asks again. The
backoff slot is held while waiting, so a rate-limited endpoint also sees fewer parallel
requests.

Budgets: every HTTP attempt counts as a request. A new attempt starts only if
``max_requests`` would not be exceeded and the spent cost plus the in-flight attempts,
each priced at the dearest attempt seen so far, stays within ``max_cost_usd``. Requests
that cannot start get ``status="budget"``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import random
import ssl
import time
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from tqdm import tqdm

from pipeline.core.cache import MISSING, CriticCache, cache_key
from pipeline.core.errors import ConfigError, CriticError
from pipeline.critic.constraint import bounded_body, constrained
from pipeline.critic.endpoint import Endpoint
from pipeline.critic.servers import KINDS, body_for

__all__ = ["CriticClient", "CriticResult", "RunStats"]

TRUNCATED_ERROR = "truncated (finish_reason=length); raise critic.max_tokens"
SAMPLING_PARAMS = ("temperature", "top_p", "max_tokens", "seed", "stop", "n")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
_LOCAL_PLACEHOLDER_KEY = "drlc-local-no-key"
_RETRY_STATUS = (408, 409, 429)


@dataclass(frozen=True)
class CriticResult:
    """The outcome of one critic request (one per request given to :meth:`CriticClient.run`)."""

    status: str  # "ok" | "truncated" | "api_error" | "budget"
    cache_key: str
    cache_hit: bool = False
    raw_text: str = ""
    finish_reason: str = ""
    model: str = ""
    system_fingerprint: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0  # paid in this call; 0.0 for cache hits and in-call duplicates
    latency_s: float = 0.0
    attempts: int = 0
    error: str = ""


@dataclass
class RunStats:
    """Counters of one :meth:`CriticClient.run` call."""

    requests_sent: int = 0  # HTTP attempts, retries included
    cache_hits: int = 0  # requests answered from the cache (each repeat of a cached request counts)
    retries: int = 0
    failures: int = 0  # requests that ended as api_error
    truncated: int = 0  # requests sent this run answered with finish_reason "length" (cached too)
    budget_stopped: int = 0
    cost_usd: float = 0.0
    in_flight: int = field(default=0, repr=False)
    dearest_attempt_usd: float = field(default=0.0, repr=False)


class _Attempt(Exception):
    """One failed attempt: ``retry`` says whether another attempt may succeed."""

    def __init__(self, reason: str, *, retry: bool, retry_after: float | None = None, cost_usd: float = 0.0):
        super().__init__(reason)
        self.reason, self.retry, self.retry_after, self.cost_usd = reason, retry, retry_after, cost_usd


def _check_base_url(base_url: str) -> str:
    parts = urlsplit(str(base_url))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CriticError(
            f"critic.endpoint {base_url!r} is not an http(s) URL with a host; "
            "use e.g. 'https://api.openai.com/v1' or 'http://127.0.0.1:8000/v1'"
        )
    try:
        parts.port
    except ValueError as error:
        raise CriticError(f"critic.endpoint {base_url!r} has a bad port ({error})") from error
    return parts.hostname


def api_key_for(base_url: str) -> str:
    """Return OPENAI_API_KEY, or a placeholder for a loopback URL; raise if a remote URL has none."""
    host = _check_base_url(base_url)
    key = os.environ.get("OPENAI_API_KEY", "")
    if key:
        return key
    if host in LOOPBACK_HOSTS or host.startswith("127."):
        return _LOCAL_PLACEHOLDER_KEY
    raise CriticError(
        f"OPENAI_API_KEY is not set and critic.endpoint {base_url!r} is not loopback; "
        "export OPENAI_API_KEY or point critic.endpoint at a local server"
    )


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """The default TLS context (system CA bundle), built once per process.

    httpx builds one per client, which loads the CA bundle: ~0.1 s of CPU per
    :meth:`CriticClient.run` call, even for a plain-http local server.
    """
    import httpx2

    return httpx2.create_ssl_context()


def _check_sampling(sampling: dict | None) -> dict:
    sampling = dict(sampling or {})
    unknown = sorted(set(sampling) - set(SAMPLING_PARAMS))
    if unknown:
        raise ConfigError(f"unknown critic sampling parameter(s) {unknown}; valid: {list(SAMPLING_PARAMS)}")
    if sampling.get("n") not in (None, 1):
        raise ConfigError(f"critic sampling n={sampling['n']!r} is not supported; use n=1 and sample_index")
    return {k: v for k, v in sampling.items() if v is not None}


class CriticClient:
    """Send chat requests to an OpenAI-compatible endpoint through the critic cache.

    :param base_url: endpoint base URL, e.g. ``"http://127.0.0.1:8000/v1"``
    :param model: model name sent with every request
    :param max_concurrency: most requests in flight at once
    :param timeout_s: per-attempt timeout in seconds
    :param max_retries: retries after the first attempt of a request
    :param backoff_base_s: first backoff delay; doubles per retry
    :param backoff_max_s: longest backoff and longest ``Retry-After`` honoured
    :param seed: seeds the backoff jitter (per request and attempt, so runs repeat)
    :param prices: model -> (USD per 1M prompt tokens, USD per 1M completion tokens)
    :param max_requests: most HTTP attempts per :meth:`run` call (``None`` = unlimited)
    :param max_cost_usd: most dollars per :meth:`run` call (``None`` = unlimited)
    :param sampling: sampling parameters sent with every request (see ``SAMPLING_PARAMS``)
    :param model_id: the model's identity in cache keys (default ``model``). drlc's local server
        answers with its backend whatever model name is sent, so the critique stage names the
        backend here (``"drlc-local:<backend>"``) and answers of two backends never mix.
    :param template_sha: SHA-256 of the template that rendered the messages; in every cache key
    :param cache_namespace: separates caches (``critic.cache_namespace``); in every cache key
    :param extra_body: fields added to every request body (``critic.extra_body``, e.g. llama.cpp's
        ``repeat_penalty``); in every cache key. A field drlc sets itself may not be overridden.
    :param server: the server kind (``critic.server``: drlc, llamacpp, vllm, sglang, openai) or ``"auto"``
        (ask ``GET /models``); decides where a constrained body's fields go
    :param connect_wait_s: how long the first request waits for an endpoint that refuses connections
        (``critic.connect_wait_s``); 0 fails at once
    :raises CriticError: on a malformed base URL or a missing API key for a remote URL
    :raises ConfigError: on an unknown sampling parameter, or a cost budget without a price
    """

    def __init__(
        self, *, base_url: str, model: str, max_concurrency: int = 8, timeout_s: float = 60.0,
        max_retries: int = 5, backoff_base_s: float = 0.5, backoff_max_s: float = 30.0, seed: int = 0,
        prices: dict[str, tuple[float, float]] | None = None, max_requests: int | None = None,
        max_cost_usd: float | None = None, sampling: dict | None = None, model_id: str | None = None,
        template_sha: str = "", cache_namespace: str = "", extra_body: dict | None = None,
        server: str = "auto", connect_wait_s: float = 0.0,
    ) -> None:
        self._api_key = api_key_for(base_url)
        self.base_url, self.model = str(base_url), model
        self.model_id, self.template_sha, self.cache_namespace = model_id or model, template_sha, cache_namespace
        self.sampling = _check_sampling(sampling)
        self.extra_body = _check_extra_body(extra_body)
        if max_concurrency < 1 or max_retries < 0 or timeout_s <= 0:
            raise ConfigError(
                f"critic max_concurrency={max_concurrency}, max_retries={max_retries}, timeout_s={timeout_s}: "
                "need max_concurrency >= 1, max_retries >= 0, timeout_s > 0"
            )
        self.prices = dict(prices or {})
        if max_cost_usd is not None and model not in self.prices:
            raise ConfigError(f"critic max_cost_usd is set but critic prices has no entry for model {model!r}")
        self.max_concurrency, self.timeout_s, self.max_retries = max_concurrency, timeout_s, max_retries
        self.backoff_base_s, self.backoff_max_s, self.seed = backoff_base_s, backoff_max_s, seed
        self.max_requests, self.max_cost_usd = max_requests, max_cost_usd
        if server != "auto" and server not in KINDS or connect_wait_s < 0:
            raise ConfigError(f"critic server={server!r}, connect_wait_s={connect_wait_s!r}: need server auto or "
                              f"one of {list(KINDS)}, and connect_wait_s >= 0")
        self.server, self.connect_wait_s = server, connect_wait_s
        self.endpoint = Endpoint(self.base_url, server, connect_wait_s=connect_wait_s, timeout_s=timeout_s,
                                 sends=max_requests != 0)
        self.last_stats = RunStats()

    @property
    def kind(self) -> str | None:
        """The server kind (``critic.server``, or what auto found; None until then): :class:`Endpoint`'s."""
        return self.endpoint.kind

    def __repr__(self) -> str:  # never shows the API key
        return f"CriticClient(base_url={self.base_url!r}, model={self.model!r})"

    def key_for(self, messages: list[dict], sample_index: int = 0, body: dict | None = None) -> str:
        """Return the cache key this client uses for ``messages`` (with per-request canonical ``body`` fields).

        The key holds the body as sent to :attr:`kind`; before ``auto`` has found the server, the
        canonical body as drlc's and llama.cpp's servers take it.
        """
        return self._key(messages, sample_index, body_for(self.kind or "drlc", self._bounded(body or {})))

    def _bounded(self, body: dict) -> dict:
        """``body`` bounded so its longest constrained answer closes within ``max_tokens`` (structured.bounded_body)."""
        return bounded_body(body, self.sampling.get("max_tokens"))

    def _key(self, messages: list[dict], sample_index: int, sent: dict) -> str:
        return cache_key(model=self.model_id, messages=messages, template_sha=self.template_sha,
                         sample_index=sample_index, namespace=self.cache_namespace, **self.sampling,
                         body={**self.extra_body, **sent})

    def cost_of(self, model: str, prompt_tokens: int, completion_tokens: int) -> float:
        """Price tokens with ``prices[model]`` (falling back to the requested model; 0 if unpriced)."""
        per_million = self.prices.get(model) or self.prices.get(self.model) or (0.0, 0.0)
        return (prompt_tokens * per_million[0] + completion_tokens * per_million[1]) / 1e6

    def run(self, requests: list[list[dict]], cache: CriticCache, *, sample_index: int = 0,
            progress: bool = False, bodies: list[dict] | None = None) -> list[CriticResult]:
        """Answer every request (a list of chat messages), in order; see the module doc.

        :param requests: one message list per request
        :param cache: the critic cache (read first, every complete answer written)
        :param sample_index: sample index put into every cache key
        :param progress: show a tqdm bar over unique requests
        :param bodies: per request, extra body fields (``response_format``, ``grammar``...); in its cache key
        :return: one :class:`CriticResult` per request; call counters in ``self.last_stats``
        """
        return asyncio.run(self.arun(requests, cache, sample_index=sample_index, progress=progress, bodies=bodies))

    async def arun(self, requests: list[list[dict]], cache: CriticCache, *, sample_index: int = 0,
                   progress: bool = False, bodies: list[dict] | None = None) -> list[CriticResult]:
        """Async form of :meth:`run` (for callers already inside an event loop)."""
        import openai  # 0.6 s to import: only once the critic is called (not for --help or a disabled critic)

        stats = self.last_stats = RunStats()
        self._answered = False  # until an HTTP response arrives, a failed connect stops the run (see _attempt)
        self.endpoint.new_call()  # the one wait for a starting server (connect_wait_s), shared by this call's requests
        bodies = [{}] * len(requests) if bodies is None else bodies
        if len(bodies) != len(requests):
            raise ConfigError(f"CriticClient.run got {len(bodies)} bodies for {len(requests)} requests")
        bodies = [self._bounded(body) for body in bodies]
        bar = None
        try:
            async with openai.AsyncOpenAI(
                    base_url=self.base_url, api_key=self._api_key, max_retries=0, timeout=self.timeout_s,
                    http_client=openai.DefaultAsyncHttpxClient(verify=_tls_context())) as api:
                if any(constrained(body) for body in bodies):
                    await self.endpoint.kind_for(api)
                sent = [body_for(self.kind, body) for body in bodies] if self.kind else bodies
                keys = [self._key(messages, sample_index, body) for messages, body in zip(requests, sent)]
                unique = dict(zip(keys, zip(requests, sent)))  # first occurrence of each key, in order
                canonical = dict(zip(keys, bodies))
                bar = tqdm(total=len(unique), desc="critic requests", unit="req", disable=not progress)
                semaphore = asyncio.Semaphore(self.max_concurrency)
                answers = await asyncio.gather(
                    *(self._answer(api, semaphore, key, request, cache, bar) for key, request in unique.items()),
                    return_exceptions=True)  # every task ends before one error is raised: no stray tracebacks
            raised = next((a for a in answers if isinstance(a, BaseException)), None)
            if raised is not None:
                raise raised
        finally:  # one counter write per call, not one per attempt (each is a SQLite commit)
            cache.tally(requests=stats.requests_sent)
            if bar is not None:
                bar.close()
        done = dict(zip(unique, answers))
        stats.cache_hits = sum(done[key].cache_hit for key in keys)
        self._check_constraints(canonical, done)
        return _expand(keys, done)

    def _check_constraints(self, canonical: dict[str, dict], done: dict[str, CriticResult]) -> None:
        """Raise CriticError (one line) if the server ignored the constraints it was sent (:class:`Endpoint`)."""
        arrived = [key for key, result in done.items() if result.status in ("ok", "truncated")]
        self.endpoint.check_answers([canonical[key] for key in arrived],
                                    [(done[key].raw_text, done[key].finish_reason) for key in arrived])

    async def _server_ready(self, api):
        """``GET /models`` once per call, waiting up to ``connect_wait_s`` (:meth:`Endpoint.ready`)."""
        payload = await self.endpoint.ready(api)
        self._answered = True
        return payload

    async def _answer(self, api, semaphore, key, request, cache, bar) -> CriticResult:
        """The cached answer for ``key``, else :meth:`_request`'s.

        Each task looks its key up itself, so the first requests are on the wire while the
        rest are still being looked up (a lookup is a SQLite read plus a counter write).
        """
        value = cache.get(key)
        if value is MISSING:
            return await self._request(api, semaphore, key, request, cache, bar)
        cache.tally(cost_usd_saved=self.cost_of(value["model"], *_usage_of(value)))
        bar.update()
        return self._result_from_cache(key, value)

    def _result_from_cache(self, key: str, value: dict) -> CriticResult:
        prompt_tokens, completion_tokens = _usage_of(value)
        truncated = value["finish_reason"] == "length"
        return CriticResult(
            status="truncated" if truncated else "ok", error=TRUNCATED_ERROR if truncated else "",
            cache_key=key, cache_hit=True, raw_text=value["raw_text"],
            finish_reason=value["finish_reason"] or "", model=value["model"] or "",
            system_fingerprint=value["system_fingerprint"] or "", prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens, latency_s=float(value["latency_s"]),
        )

    def _budget_refusal(self) -> str:
        """Return why a new attempt may not start, or "" if it may."""
        stats = self.last_stats
        if self.max_requests is not None and stats.requests_sent + 1 > self.max_requests:
            return f"budget: max_requests={self.max_requests} reached"
        if self.max_cost_usd is not None:
            committed = stats.cost_usd + (stats.in_flight + 1) * stats.dearest_attempt_usd
            if committed > self.max_cost_usd:
                return f"budget: max_cost_usd={self.max_cost_usd} would be exceeded (spent {stats.cost_usd:.6f})"
        return ""

    async def _request(self, api, semaphore, key, request, cache, bar) -> CriticResult:
        """Send one request with retries; store the answer in the cache if it succeeds."""
        stats, attempts, error = self.last_stats, 0, ""
        async with semaphore:
            while True:
                refusal = self._budget_refusal()
                if refusal:
                    stats.budget_stopped += 1
                    bar.update()
                    return CriticResult(status="budget", cache_key=key, attempts=attempts,
                                        error=f"{refusal}; last error: {error}" if error else refusal)
                if self.connect_wait_s > 0 and not self._answered:
                    await self._server_ready(api)  # a server still starting: wait for it before the first attempt
                attempts += 1
                stats.requests_sent += 1
                stats.in_flight += 1
                try:
                    result = await self._attempt(api, key, request, attempts)
                except _Attempt as failure:
                    stats.cost_usd += failure.cost_usd
                    delay = self._retry_delay(failure, key, attempts)
                    error = self._scrub(failure.reason)
                    if delay is None:
                        stats.failures += 1
                        bar.update()
                        return CriticResult(status="api_error", cache_key=key, attempts=attempts, error=error)
                    stats.retries += 1
                    await asyncio.sleep(delay)
                    continue
                finally:
                    stats.in_flight -= 1
                stats.cost_usd += result.cost_usd
                stats.dearest_attempt_usd = max(stats.dearest_attempt_usd, result.cost_usd)
                bar.update()
                if result.status == "truncated":
                    stats.truncated += 1
                cache.put(key, {
                    "raw_text": result.raw_text, "finish_reason": result.finish_reason,
                    "usage": {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens},
                    "model": result.model, "system_fingerprint": result.system_fingerprint or None,
                    "latency_s": result.latency_s,
                })
                return result

    def _retry_delay(self, failure: _Attempt, key: str, attempts: int) -> float | None:
        """Seconds to wait before the next attempt, or None if the request has failed for good."""
        if not failure.retry or attempts > self.max_retries:
            return None
        if failure.retry_after is not None:
            if failure.retry_after > self.backoff_max_s:
                failure.reason += f" (retry_after {failure.retry_after:g}s > backoff_max_s {self.backoff_max_s:g}s)"
                return None
            return max(failure.retry_after, 0.0)
        jitter = random.Random(f"{self.seed}:{key}:{attempts}").random()
        return min(self.backoff_max_s, self.backoff_base_s * 2 ** (attempts - 1)) * (0.5 + 0.5 * jitter)

    async def _attempt(self, api, key: str, request: tuple[list[dict], dict], attempts: int) -> CriticResult:
        """Make one HTTP attempt; return an ok or truncated result, or raise :class:`_Attempt`."""
        import httpx2
        import openai
        from openai.types.chat import ChatCompletion

        started = time.monotonic()
        messages, extra = request
        body = {**self.extra_body, **extra, "model": self.model, "messages": messages, **self.sampling}
        try:  # post, not chat.completions.create: the body is plain JSON already, and create's
            # recursive parameter transform cost ~1 ms of CPU per request, serialised on the event loop
            completion = await asyncio.wait_for(api.post("/chat/completions", body=body, cast_to=ChatCompletion),
                                                timeout=self.timeout_s)
        except (openai.APITimeoutError, asyncio.TimeoutError):
            raise _Attempt(f"timeout after {self.timeout_s:g}s", retry=True) from None
        except openai.APIConnectionError as error:
            if isinstance(error.__cause__, httpx2.ConnectError) and not self._answered:  # ends the call (arun)
                raise CriticError(f"critic endpoint {self.base_url} is unreachable ({error.__cause__}) and has "
                                  f"answered nothing in this run: start the server there or fix critic.endpoint"
                                  ) from None
            raise _Attempt(f"connection_error: {error}", retry=True) from None
        except openai.APIStatusError as error:
            self._answered = True  # it answers, with an error: retried as documented
            status = error.status_code
            refusal = _format_refusal(status, str(error), body)
            if refusal:
                raise _Attempt(refusal, retry=False) from None
            retry = status in _RETRY_STATUS or status >= 500
            raise _Attempt(f"http_{status}: {str(error)[:200]}", retry=retry,
                           retry_after=_retry_after_s(error.response.headers) if retry else None) from None
        except (json.JSONDecodeError, openai.APIResponseValidationError, ValueError) as error:  # pydantic's too
            self._answered = True
            raise _Attempt(f"bad_body: {type(error).__name__}: {str(error)[:120]}", retry=True) from None
        self._answered = True
        latency = time.monotonic() - started
        return self._check_completion(completion, key, attempts, latency)

    def _check_completion(self, completion, key: str, attempts: int, latency: float) -> CriticResult:
        choices = getattr(completion, "choices", None)
        if not choices or getattr(choices[0], "message", None) is None:
            raise _Attempt("bad_body: no choices[0].message in response", retry=True)
        usage = getattr(completion, "usage", None)
        prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
        completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
        model = getattr(completion, "model", None) or self.model
        cost = self.cost_of(model, prompt_tokens, completion_tokens)
        text, finish_reason = choices[0].message.content or "", choices[0].finish_reason or ""
        if finish_reason == "content_filter":
            raise _Attempt("content_filter", retry=False, cost_usd=cost)
        truncated = finish_reason == "length"
        if not truncated and not text.strip():
            raise _Attempt("empty_content", retry=True, cost_usd=cost)
        return CriticResult(
            status="truncated" if truncated else "ok", cache_key=key, raw_text=text,
            error=TRUNCATED_ERROR if truncated else "",
            finish_reason=finish_reason, model=model,
            system_fingerprint=getattr(completion, "system_fingerprint", None) or "",
            prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, cost_usd=cost,
            latency_s=latency, attempts=attempts,
        )

    def _scrub(self, text: str) -> str:
        """Remove the API key from an error message."""
        return text.replace(self._api_key, "***") if self._api_key else text


_RESERVED_BODY = ("model", "messages") + SAMPLING_PARAMS


def _check_extra_body(extra_body: dict | None) -> dict:
    extra_body = dict(extra_body or {})
    clash = sorted(set(extra_body) & set(_RESERVED_BODY))
    if clash:
        raise ConfigError(f"critic.extra_body sets {clash}, which drlc sends itself; set critic.temperature/"
                          f"critic.max_tokens (or the critic key of that name) instead")
    return extra_body


def _format_refusal(status: int, message: str, body: dict) -> str:
    """One line when the endpoint refused critic.answer_format's fields, else ""."""
    sent = [name for name in ("response_format", "grammar", "structured_outputs", "ebnf") if name in body]
    if not sent:
        return ""
    named = any(word in message.lower() for word in ("response_format", "json_schema", "grammar",
                                                     "structured_outputs", "ebnf"))
    if not (400 <= status < 500 and status not in _RETRY_STATUS) and not (status >= 500 and named):
        return ""
    fix = ("set critic.answer_format: copy (a GBNF grammar, for llama.cpp) or text" if "response_format" in sent
           else "set critic.answer_format: json or text (this endpoint takes no GBNF grammar)" if "grammar" in sent
           else "set critic.server to the server it is (auto asks it), or critic.answer_format: text")
    return (f"answer_format_refused: http_{status}: the endpoint refused the {'/'.join(sent)} that "
            f"critic.answer_format sends ({' '.join(message.split())[:120]}); {fix}")


def _usage_of(value: dict) -> tuple[int, int]:
    return int(value["usage"]["prompt_tokens"]), int(value["usage"]["completion_tokens"])


def _retry_after_s(headers) -> float | None:
    """Parse ``retry-after-ms`` or ``retry-after`` (seconds; HTTP dates are ignored)."""
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        raw = headers.get(name) if headers is not None else None
        if raw is None:
            continue
        try:
            seconds = float(raw) / divisor
        except ValueError:
            continue
        if seconds == seconds:  # NaN falls back to the exponential backoff
            return max(seconds, 0.0)
    return None


def _expand(keys: list[str], done: dict[str, CriticResult]) -> list[CriticResult]:
    """One result per request; a repeat of a key within the call was not sent again: no cost, 0 attempts."""
    seen: set[str] = set()
    results = []
    for key in keys:
        result = done[key]
        results.append(replace(result, cost_usd=0.0, attempts=0) if key in seen else result)
        seen.add(key)
    return results
