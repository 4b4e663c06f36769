"""Which server answers the critic (``critic.server``), where each takes a constrained answer, and a check that it did.

drlc builds one constrained request per ``critic.answer_format`` (:mod:`pipeline.critic.structured`):
``json`` as OpenAI's strict ``response_format``, ``copy``/``copy_words`` as a GBNF ``grammar`` plus
drlc's own ``drlc_copy``. That is the *canonical* body: drlc's own server reads it, and llama.cpp's
server reads its ``grammar``. Other servers take the same constraint in other fields, and silently
ignore fields they do not know (vLLM logs and drops a top-level ``grammar``), so
:func:`body_for` rewrites the canonical body for the server kind:

========== ======================================== ===========================
kind       json                                     copy, copy_words
========== ======================================== ===========================
drlc       ``response_format`` (json_schema)        ``grammar`` + ``drlc_copy``
llamacpp   ``response_format`` (json_schema)        ``grammar`` + ``drlc_copy``
vllm       ``structured_outputs: {json: schema}``   ``structured_outputs: {grammar: GBNF}``
sglang     ``response_format`` (json_schema)        ``ebnf: GBNF``
openai     ``response_format`` (json_schema)        refused: OpenAI takes no grammar
========== ======================================== ===========================

drlc and llamacpp keep the canonical body, so their cache keys are those of the drlc that
sent it before ``critic.server`` existed; the kind enters a key only through the body it changes.

``critic.server: auto`` asks ``GET /v1/models`` once per client (:func:`kind_from_models`):
``owned_by`` is ``vllm``, ``sglang``, ``llamacpp`` (llama.cpp's C++ ``llama-server``), ``drlc``;
llama-cpp-python's server says ``me`` and lists ``permissions``; OpenAI's models say ``openai``,
``system`` or ``openai-internal``. A text answer has no constraint, so it never asks.

A constraint sent where it is ignored must not pass silently. :func:`breaks_constraint` checks an
answer against the constraint its request carried (a ``copy`` answer through the same automaton
drlc's hf backend decodes under, a ``json`` answer against the schema), and :func:`ignored_constraint`
turns a call's answers into one error line when more than :data:`BREAK_SHARE` of them break it: a
server that applies the constraint breaks none, one that ignores it breaks nearly all.
"""
from __future__ import annotations

import asyncio
import json
import sys
import time

from pipeline.core.config import CRITIC_SERVERS
from pipeline.core.errors import ConfigError, CriticError

__all__ = ["BREAK_SHARE", "CONSTRAINT_FIELDS", "KINDS", "body_for", "breaks_constraint", "constrained",
           "detected_kind", "ignored_constraint", "kind_from_models", "probe"]

KINDS = tuple(kind for kind in CRITIC_SERVERS if kind != "auto")
CONSTRAINT_FIELDS = ("response_format", "grammar", "drlc_copy")  # the canonical body's constraint fields
BREAK_SHARE = 0.05
"""Largest share of a call's checked answers that may break their constraint before the call stops.

A server that applies the constraint breaks none (a ``copy`` grammar makes any other answer
impossible); one that ignores it breaks nearly all (measured: every answer of SmolLM2-135M through
vLLM sent a top-level ``grammar``). 5 % leaves room for one odd answer in a long run, and is the
issue's ceiling for answers wasted by form."""
_OPENAI_OWNERS = ("openai", "system", "openai-internal")


def constrained(body: dict) -> bool:
    """Whether a canonical body carries a constraint (json, copy or copy_words)."""
    return any(name in body for name in CONSTRAINT_FIELDS)


def body_for(kind: str, body: dict) -> dict:
    """The canonical ``body`` as server ``kind`` takes it (see the module's table); other fields as they are.

    >>> body_for("vllm", {"grammar": "root ::= \\"x\\"", "drlc_copy": {}, "repeat_penalty": 1.0})
    {'repeat_penalty': 1.0, 'structured_outputs': {'grammar': 'root ::= "x"'}}
    """
    if kind not in KINDS:
        raise ConfigError(f"critic server kind {kind!r} is unknown; use one of {list(KINDS)}")
    if kind in ("drlc", "llamacpp") or not constrained(body):
        return body
    rest = {name: value for name, value in body.items() if name not in CONSTRAINT_FIELDS}
    grammar, response_format = body.get("grammar"), body.get("response_format")
    if kind == "vllm":
        if grammar is not None:
            return rest | {"structured_outputs": {"grammar": grammar}}
        schema = response_format["json_schema"]["schema"]
        bound = {"disable_any_whitespace": True} if _bounded(schema) else {}  # no free spacing: the bound holds
        return rest | {"structured_outputs": {"json": schema} | bound}
    if grammar is not None:
        if kind == "openai":
            raise ConfigError("critic.server openai takes no grammar (critic.answer_format copy/copy_words): use "
                              "critic.answer_format: json, or a vllm, sglang or llama.cpp server")
        return rest | {"ebnf": grammar}  # sglang
    return rest | {"response_format": response_format}  # sglang, openai: json as OpenAI's response_format


def _bounded(schema: dict) -> bool:
    """Whether drlc's span schema carries the answer bound (a span text ``maxLength``)."""
    return "maxLength" in schema["properties"]["spans"]["items"]["properties"]["text"]


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


def breaks_constraint(body: dict, text: str, finish_reason: str) -> bool:
    """Whether an answer breaks the constraint its canonical ``body`` carried (False for a body without one).

    ``copy``/``copy_words``: the answer, run through :class:`~pipeline.critic.offline.constrained.SpanAutomaton`
    (the grammar's language), is refused at some character, or, if complete, is not closed. ``json``: the
    answer is not one object of the schema (``spans``: at most ``maxItems`` objects with exactly a ``label``
    of the enum and a ``text`` string, any spacing), or, cut off (``finish_reason`` length), not a prefix of
    one. Whitespace around the answer is allowed.
    """
    text, complete = (text or "").strip(), finish_reason != "length"
    copy = body.get("drlc_copy")
    if copy is not None:
        from pipeline.critic.offline.constrained import SpanAutomaton

        automaton = SpanAutomaton(copy["labels"], int(copy["max_spans"]), copy["source"], bool(copy.get("words")),
                                  copy.get("max_span_bytes"))
        state = automaton.start
        for ch in text:
            state = automaton.step(state, ch)
            if state is None:  # the automaton also refuses whitespace-only spans, which the grammar allows
                return not (complete and _copied_exactly(text, copy))
        return complete and not automaton.is_done(state)
    response_format = body.get("response_format")
    if not response_format:
        return False
    from pipeline.critic.structured import schema_bound

    labels, max_items, max_chars = schema_bound(response_format)
    return not _SchemaReader(text, labels, max_items, max_chars).fits(complete)


def _copied_exactly(text: str, copy: dict) -> bool:
    """A complete ``copy`` answer in the grammar's layout whose every span is copied (whitespace-only ones too)."""
    from pipeline.critic.grammar import span_bounds

    try:
        data = json.loads(text)
    except ValueError:
        return False
    if not isinstance(data, dict) or json.dumps(data, ensure_ascii=False) != text or list(data) != ["spans"]:
        return False  # json.dumps writes the grammar's one layout: ", " and ": ", characters as json_units
    source, spans, limit = copy["source"], data["spans"], copy.get("max_span_bytes")
    starts, ends = span_bounds(source, bool(copy.get("words")))
    starts = set(starts)
    if not isinstance(spans, list) or len(spans) > int(copy["max_spans"]):
        return False
    for span in spans:
        if not (isinstance(span, dict) and list(span) == ["label", "text"] and span["label"] in copy["labels"]
                and isinstance(span["text"], str) and span["text"]):
            return False
        if limit is not None and len(json.dumps(span["text"], ensure_ascii=False).encode()) - 2 > limit:
            return False
        at = [i for i in range(len(source)) if source.startswith(span["text"], i)]
        if not any(i in starts and i + len(span["text"]) in ends for i in at):
            return False
    return True


class _Ended(Exception):
    """The text ran out: what was read is a prefix of an answer of the schema."""


class _SchemaReader:
    """Reads ``{"spans": [{"label": <enum>, "text": <string>}, ...]}`` (any spacing, either key order).

    :meth:`fits` says whether the text is such an answer (``complete``) or a prefix of one (cut off).
    """

    def __init__(self, text: str, labels, max_items: int | None, max_chars: int | None = None) -> None:
        self.text, self.i, self.labels, self.max_items, self.max_chars = text, 0, set(labels), max_items, max_chars

    def fits(self, complete: bool) -> bool:
        try:
            self._answer()
        except _Ended:
            return not complete
        except ValueError:
            return False
        self._space()
        return self.i == len(self.text)

    def _peek(self) -> str:
        if self.i >= len(self.text):
            raise _Ended
        return self.text[self.i]

    def _space(self) -> None:
        while self.i < len(self.text) and self.text[self.i] in " \t\n\r":
            self.i += 1

    def _literal(self, expected: str) -> None:
        for ch in expected:
            if self._peek() != ch:
                raise ValueError(f"expected {expected!r} at {self.i}")
            self.i += 1
        self._space()

    def _string(self) -> str:
        start = self.i
        self._literal('"')
        while self._peek() != '"':
            if self._peek() == "\\":
                self.i += 1
                self._peek()
            elif ord(self._peek()) < 0x20:
                raise ValueError("control character in a string")
            self.i += 1
        self.i += 1
        value = json.loads(self.text[start:self.i])
        self._space()
        return value

    def _answer(self) -> None:
        self._space()
        self._literal("{")
        if self._string() != "spans":
            raise ValueError('the one key is "spans"')
        self._literal(":")
        self._literal("[")
        count = 0
        while self._peek() != "]":
            if count:
                self._literal(",")
            self._item()
            count += 1
            if self.max_items is not None and count > self.max_items:
                raise ValueError("too many spans")
        self._literal("]")
        self._literal("}")

    def _item(self) -> None:
        self._literal("{")
        seen = []
        while self._peek() != "}" or len(seen) < 2:
            if seen:
                self._literal(",")
            key = self._string()
            if key not in ("label", "text") or key in seen:
                raise ValueError(f"key {key!r}")
            self._literal(":")
            value = self._string()
            if key == "label" and value not in self.labels:
                raise ValueError(f"label {value!r}")
            if key == "text" and self.max_chars is not None and not 1 <= len(value) <= self.max_chars:
                raise ValueError(f"text of {len(value)} characters")
            seen.append(key)
        self._literal("}")


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
