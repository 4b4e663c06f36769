"""The critic's endpoint as a server: which kind it is, whether it is up, and whether it applied the constraints it was sent.

:class:`Endpoint` holds, for one :class:`~pipeline.critic.client.CriticClient`, what the client learns
about the server behind ``critic.endpoint``; the client does HTTP, retries, cache and budget.

- **Detection** (``critic.server: auto``): ``GET /v1/models`` once per client, and only when a body is
  constrained (:func:`kind_from_models`): ``owned_by`` is ``vllm``, ``sglang``, ``llamacpp`` (llama.cpp's
  C++ ``llama-server``), ``drlc``; llama-cpp-python's server says ``me`` and lists ``permissions``;
  OpenAI's models say ``openai``, ``system`` or ``openai-internal``. A text answer has no constraint, so
  it never asks.
- **Confirmation**: ``critic.server: drlc`` is trusted unchecked, so it is first checked against
  ``GET /models`` (once per client).
- **Readiness**: :func:`probe` waits up to ``critic.connect_wait_s`` for a server still starting.
- **Constraint checks**: a constraint sent where it is ignored must not pass silently.
  :func:`ignored_constraint` turns a call's answers into one error line when more than
  :data:`BREAK_SHARE` of them break their constraint
  (:func:`pipeline.critic.constraint.breaks_constraint`): a server that applies the constraint breaks
  none, one that ignores it breaks nearly all.
"""
from __future__ import annotations

import asyncio
import sys
import time

from pipeline.core.errors import CriticError
from pipeline.critic.constraint import CONSTRAINT_FIELDS, breaks_constraint, constrained
from pipeline.critic.servers import KINDS, body_for

__all__ = ["BREAK_SHARE", "Endpoint", "detected_kind", "ignored_constraint", "kind_from_models", "probe"]

BREAK_SHARE = 0.05
"""Largest share of a call's checked answers that may break their constraint before the call stops.

A server that applies the constraint breaks none (a ``copy`` grammar makes any other answer
impossible); one that ignores it breaks nearly all (measured: every answer of SmolLM2-135M through
vLLM sent a top-level ``grammar``). 5 % leaves room for one odd answer in a long run, and is the
issue's ceiling for answers wasted by form."""
_OPENAI_OWNERS = ("openai", "system", "openai-internal")


class Endpoint:
    """What one client knows of its server: its kind (``critic.server``), one readiness wait per call, the checks.

    :param server: ``critic.server``: a kind, or ``auto`` (ask ``GET /models`` when a body is constrained)
    :param sends: whether the client may send anything (a replay or batch file client sends nothing, so
        it cannot ask ``auto``'s question, and does not confirm ``drlc``)
    """

    def __init__(self, base_url: str, server: str, *, connect_wait_s: float, timeout_s: float, sends: bool) -> None:
        self.base_url, self.connect_wait_s, self.timeout_s, self.sends = base_url, connect_wait_s, timeout_s, sends
        self.kind = None if server == "auto" else server  # the server kind, once known (auto: after GET /models)
        self._confirmed = False  # a drlc kind checked against GET /models (see confirm)
        self._ready = None  # this call's one wait for a starting server, shared by its requests

    def new_call(self) -> None:
        """Forget the last call's readiness wait (each call waits for its server once)."""
        self._ready = None

    async def ready(self, api):
        """``GET /models`` once per call, waiting up to ``connect_wait_s`` (:func:`probe`); its JSON or None."""
        if self._ready is None:
            self._ready = asyncio.ensure_future(probe(api, base_url=self.base_url, wait_s=self.connect_wait_s,
                                                      timeout_s=self.timeout_s))
        return await asyncio.shield(self._ready)

    async def kind_for(self, api) -> str:
        """The server kind for a call with a constrained body: detected (auto) or confirmed (drlc)."""
        self.kind = await self.detect(api) if self.kind is None else await self.confirm(api)
        return self.kind

    async def detect(self, api) -> str:
        """critic.server auto: the server kind its ``GET /models`` names (CriticError, one line, if none)."""
        if not self.sends:
            raise CriticError("critic.server is auto, but this client sends nothing (a replay without new calls, a "
                              "batch file), so it cannot ask the endpoint which server it is: set critic.server to "
                              f"the server that answered ({', '.join(KINDS)})")
        return detected_kind(await self.ready(api), self.base_url)

    async def confirm(self, api) -> str:
        """The server kind, where it is ``drlc``: first checked against its ``GET /models`` (once per client).

        drlc's own server is trusted to honour ``drlc_copy``, so its answers are not checked; another server
        set as drlc would get a grammar it may ignore, unchecked. A client that sends nothing asks nothing.
        """
        if self.kind != "drlc" or self._confirmed or not self.sends:
            return self.kind
        found = kind_from_models(await self.ready(api), self.base_url)
        if found != "drlc":
            raise CriticError(f"critic.server is drlc (drlc's own server, whose answers are trusted unchecked), but "
                              f"{self.base_url}/models says {found or 'another server'}: set critic.server: auto, "
                              f"or to the server it is")
        self._confirmed = True
        return self.kind

    def check_answers(self, bodies: list[dict], answers: list[tuple[str, str]]) -> None:
        """Raise CriticError (one line) if the server ignored the constraints it was sent (drlc's own is trusted).

        :param bodies: per arrived answer (ok or truncated), the canonical body its request carried
        :param answers: per arrived answer, (text, finish_reason)
        """
        if self.kind in (None, "drlc"):
            return
        line = ignored_constraint(bodies, answers, kind=self.kind, base_url=self.base_url)
        if line:
            raise CriticError(line)


def kind_from_models(payload: object, base_url: str = "") -> str | None:
    """The server kind a ``GET /v1/models`` answer names, or None if it names none drlc knows.

    >>> kind_from_models({"data": [{"id": "m", "owned_by": "vllm"}]})
    'vllm'
    >>> kind_from_models({"data": [{"id": "m", "owned_by": "me", "permissions": []}]})
    'llamacpp'
    """
    if "api.openai.com" in base_url:
        return "openai"
    models = payload.get("data") if isinstance(payload, dict) else None
    for model in models if isinstance(models, list) else []:
        owner = str(model.get("owned_by", "")).lower() if isinstance(model, dict) else ""
        if owner in ("vllm", "sglang", "llamacpp", "drlc"):
            return owner
        if owner == "me" and "permissions" in model:  # llama-cpp-python's server (python -m llama_cpp.server)
            return "llamacpp"
        if owner in _OPENAI_OWNERS:
            return "openai"
    return None


def detected_kind(payload: object, base_url: str) -> str:
    """:func:`kind_from_models`, or CriticError (one line) naming the ``owned_by`` it found and the setting."""
    kind = kind_from_models(payload, base_url)
    if kind is None:
        models = payload.get("data") if isinstance(payload, dict) else None
        owners = sorted({str(m.get("owned_by")) for m in models if isinstance(m, dict)}) \
            if isinstance(models, list) else []
        raise CriticError(f"critic.server is auto, and {base_url}/models does not say which server it is "
                          f"(owned_by {owners or 'missing'}): set critic.server to one of {', '.join(KINDS)}")
    return kind


async def probe(api, *, base_url: str, wait_s: float, timeout_s: float):
    """``GET /models`` through an open ``openai.AsyncOpenAI``: its JSON, or None if it answers with an HTTP error.

    Connections refused and HTTP 503 (llama.cpp while its model loads) are waited out for up to
    ``wait_s`` seconds (``critic.connect_wait_s``), polling every 0.5 s; one stderr line says it waits.

    :raises CriticError: (one line) the endpoint is still not up after ``wait_s``
    """
    import httpx2
    import openai

    deadline, said = time.monotonic() + wait_s, False
    while True:
        try:
            return await asyncio.wait_for(api.get("/models", cast_to=object), timeout=timeout_s)
        except openai.APIConnectionError as error:
            if not isinstance(error.__cause__, httpx2.ConnectError):
                raise CriticError(f"critic endpoint {base_url}: GET /models failed ({error}); check "
                                  f"critic.endpoint") from None
            why = f"refuses connections ({error.__cause__})"
        except openai.APIStatusError as error:
            if error.status_code != 503:
                return None  # it answers: up (a server without /models is still a server)
            why = "answers 503 (still loading)"
        except (openai.APITimeoutError, asyncio.TimeoutError):
            why = f"did not answer GET /models within {timeout_s:g} s"
        left = deadline - time.monotonic()
        if left <= 0:
            waited = f" after waiting critic.connect_wait_s = {wait_s:g} s" if wait_s else \
                " (critic.connect_wait_s = 0: no wait)"
            raise CriticError(f"critic endpoint {base_url} {why}{waited}: start the server there, raise "
                              f"critic.connect_wait_s for a server still starting, or fix critic.endpoint")
        if not said:
            print(f"critic: {base_url} {why}; waiting up to {wait_s:g} s for it (critic.connect_wait_s)",
                  file=sys.stderr, flush=True)
            said = True
        await asyncio.sleep(min(0.5, left))


def ignored_constraint(bodies: list[dict], answers: list[tuple[str, str]], *, kind: str, base_url: str) -> str:
    """One error line if more than :data:`BREAK_SHARE` of the answers break their constraint, else "".

    :param bodies: per answer, the canonical body its request carried
    :param answers: per answer, (text, finish_reason) of an answer that arrived (ok or truncated)
    :param kind: the server kind the bodies were sent as (``critic.server``, or what auto found)
    """
    checked = [(body, answer) for body, answer in zip(bodies, answers) if constrained(body)]
    broken = [(body, answer) for body, answer in checked if breaks_constraint(body, *answer)]
    if not checked or len(broken) <= BREAK_SHARE * len(checked):
        return ""
    canonical = checked[0][0]
    sent = "/".join(name for name in body_for(kind, canonical) if name in CONSTRAINT_FIELDS or name not in canonical)
    shown = " ".join(broken[0][1][0].split())[:60]
    others = [k for k in KINDS if k not in (kind, "drlc")]
    return (f"critic.server: {len(broken)} of {len(checked)} answers from {base_url} break the constraint of "
            f"critic.answer_format (e.g. {shown!r}): the server ignored the {sent} it was sent as critic.server "
            f"{kind!r}; set critic.server to the server it is ({', '.join(others)}; auto asks it), or "
            f"critic.answer_format: text")
