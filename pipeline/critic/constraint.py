"""One constrained critic answer (``critic.answer_format`` json, copy, copy_words): built, bounded, read back and checked here.

drlc writes one *canonical* body per constrained request:

- ``json``: OpenAI's strict ``response_format`` (``json_schema``) holding :func:`span_schema`;
- ``copy``/``copy_words``: a GBNF ``grammar`` (:func:`pipeline.critic.grammar.copy_grammar`) plus
  ``drlc_copy`` (the source, labels, most spans, words, span bound), which drlc's hf backend decodes
  under (:func:`constraint_for`, :class:`~pipeline.critic.offline.constrained.SpanAutomaton`).

The answer bound (issue 43): :func:`answer_bound` computes, from ``critic.max_tokens`` and the
template's labels, how many spans an answer may hold and how long each may be, so that the longest
answer the constraint admits closes within ``max_tokens``; :func:`bounded_body` writes it into a
canonical body (the client does so for every request, so every server gets the same bound).

The same module reads the constraint back: :func:`schema_bound` (the schema's labels and limits),
:func:`requested_span_limit`, :func:`constraint_for`, and :func:`breaks_constraint`, which checks an
answer against the constraint its request carried (used by :mod:`pipeline.critic.endpoint` to
catch a server that ignored it). Where each server takes the constraint is
:func:`pipeline.critic.servers.body_for`'s table.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from pipeline.core.config import CRITIC_ANSWER_FORMATS as ANSWER_FORMATS
from pipeline.core.errors import ConfigError, CriticError
from pipeline.critic.grammar import (CLOSE, ITEM_CLOSE, ITEM_MID, ITEM_OPEN, OPEN, SEPARATOR, copy_grammar,
                                     span_bounds)

if TYPE_CHECKING:
    from pipeline.critic.offline.constrained import SpanAutomaton

__all__ = ["ANSWER_FORMATS", "CONSTRAINT_FIELDS", "MAX_SPANS", "MIN_SPAN_BYTES", "SCHEMA_NAME", "answer_bound",
           "bounded_body", "breaks_constraint", "check_format", "constrained", "constraint_for", "request_body",
           "requested_span_limit", "schema_bound", "span_schema"]

MAX_SPANS = 8
"""Most spans one structured answer may hold (the schema's ``maxItems``)."""
MIN_SPAN_BYTES = 16
"""Shortest span length :func:`answer_bound` gives each span before it allows one span fewer (a few words)."""
SCHEMA_NAME = "critic_spans"
CONSTRAINT_FIELDS = ("response_format", "grammar", "drlc_copy")  # the canonical body's constraint fields


def check_format(answer_format: str) -> str:
    """Return ``answer_format``; raise a one-line ConfigError naming the key if it is unknown."""
    if answer_format not in ANSWER_FORMATS:
        raise ConfigError(f"critic.answer_format {answer_format!r} is unknown; use one of {list(ANSWER_FORMATS)}")
    return answer_format


def answer_bound(labels, max_tokens: int) -> tuple[int, int]:
    """(most spans, most UTF-8 bytes of one span's text) so that the longest constrained answer closes within ``max_tokens``.

    Every token of a completion carries at least one byte of its text (byte-level vocabularies
    such as SmolLM2's hold all 256 bytes, so a decoder may spell any text byte by byte), so an
    answer of B bytes is at most B tokens, whatever the tokenizer; one more token is kept for
    the end of sequence (a server that stops at ``max_tokens`` reports ``length`` even when the
    object is closed). The answer's layout is fixed (:mod:`pipeline.critic.grammar`):
    ``{"spans": [`` ... ``]}`` (13 bytes), per span ``{"label": "<label>", "text": "`` ... ``"}``
    (25 bytes and the longest label) and ``, `` between spans (2). The most spans is the
    largest count up to :data:`MAX_SPANS` that leaves each span at least :data:`MIN_SPAN_BYTES`,
    else 1; the span length is what that count leaves.

    >>> answer_bound(["toxic"], 128)  # 127 bytes: 2 spans of 26: 13 + 2 * (30 + 26) + 2 = 127
    (2, 26)

    :raises ConfigError: (one line) when ``max_tokens`` cannot hold even one span of one byte
    """
    label = max(len(str(x).encode()) for x in labels)
    budget = max_tokens - 1 - len(OPEN + CLOSE) + len(SEPARATOR)  # each span then costs its separator
    per_span = len(ITEM_OPEN + ITEM_MID + ITEM_CLOSE + SEPARATOR) + label
    fits = [n for n in range(1, MAX_SPANS + 1) if budget // n - per_span >= MIN_SPAN_BYTES]
    spans = max(fits, default=1)
    length = budget // spans - per_span
    if length < 1:
        least = 1 + len(OPEN + CLOSE) + len(ITEM_OPEN + ITEM_MID + ITEM_CLOSE) + label + 1
        raise ConfigError(f"critic.max_tokens {max_tokens} cannot hold one constrained span (critic.answer_format "
                          f"json/copy/copy_words needs at least {least}): raise critic.max_tokens")
    return spans, length


def span_schema(labels, max_spans: int = MAX_SPANS, max_span_chars: int | None = None) -> dict:
    """The JSON schema of a structured answer for ``labels`` (strict: no other keys).

    ``max_span_chars`` (the answer bound) adds ``minLength`` 1 and ``maxLength`` to the span text.

    >>> span_schema(["toxic"])["properties"]["spans"]["items"]["properties"]["label"]
    {'type': 'string', 'enum': ['toxic']}
    """
    labels = [str(label) for label in labels]
    if not labels or max_spans < 1:
        raise ConfigError(f"a span schema needs labels and max_spans >= 1, got {labels!r} and {max_spans}")
    item = {"type": "object", "additionalProperties": False, "required": ["label", "text"],
            "properties": {"label": {"type": "string", "enum": labels}, "text": {"type": "string"}}}
    if max_span_chars is not None:
        item["properties"]["text"] |= {"minLength": 1, "maxLength": max_span_chars}
    return {"type": "object", "additionalProperties": False, "required": ["spans"],
            "properties": {"spans": {"type": "array", "items": item, "maxItems": max_spans}}}


def request_body(answer_format: str, labels, *, source: str, max_spans: int = MAX_SPANS,
                 max_span_bytes: int | None = None) -> dict:
    """The extra request fields for one critic request in ``answer_format`` ({} for ``text``).

    :param source: the text spans are copied from (the critiqued response), used by ``copy``
    :param max_span_bytes: the answer bound's span length (:func:`answer_bound`); None: unbounded (the
        bodies, and cache keys, of drlc before the bound). ``json`` takes it as the text's ``maxLength``
        in characters (a non-ASCII character may cost more than one token: the one gap of the bound)
    """
    check_format(answer_format)
    if answer_format == "text":
        return {}
    schema = span_schema(labels, max_spans, max_span_bytes)
    if answer_format == "json":
        return {"response_format": {"type": "json_schema",
                                    "json_schema": {"name": SCHEMA_NAME, "strict": True, "schema": schema}}}
    words = answer_format == "copy_words"
    copy = {"source": source, "labels": [str(label) for label in labels], "max_spans": max_spans} | \
        ({"words": True} if words else {}) | ({} if max_span_bytes is None else {"max_span_bytes": max_span_bytes})
    return {"grammar": copy_grammar(source, labels, max_spans=max_spans, words=words, max_span_bytes=max_span_bytes),
            "drlc_copy": copy}  # copy's bodies (and cache keys) as before


def bounded_body(body: dict, max_tokens: int | None) -> dict:
    """A canonical constrained ``body`` (:func:`request_body`) bounded by :func:`answer_bound` for ``max_tokens``.

    A body without a constraint, or ``max_tokens`` None, is returned as it is. The bound is part
    of the body, so of the cache key: answers cached under the unbounded constraint are not reused.
    """
    if max_tokens is None:
        return body
    copy, response_format = body.get("drlc_copy"), body.get("response_format")
    if copy is not None and "max_span_bytes" not in copy:
        spans, length = answer_bound(copy["labels"], max_tokens)
        fmt = "copy_words" if copy.get("words") else "copy"
        return {name: value for name, value in body.items() if name not in ("grammar", "drlc_copy")} | \
            request_body(fmt, copy["labels"], source=copy["source"], max_spans=spans, max_span_bytes=length)
    if response_format is not None and response_format.get("type") == "json_schema":
        labels, _, length = schema_bound(response_format)
        if length is None:
            spans, length = answer_bound(labels, max_tokens)
            return body | request_body("json", labels, source="", max_spans=spans, max_span_bytes=length)
    return body


def schema_bound(response_format: dict) -> tuple[list[str], int, int | None]:
    """(labels, most spans, most characters of a span's text or None) of drlc's span ``json_schema`` response_format.

    The one reader of the schema :func:`span_schema` writes (the checks in :mod:`pipeline.critic.servers`,
    the hf backend's automaton).

    :raises KeyError, TypeError: for a schema not of drlc's span shape
    """
    spans = response_format["json_schema"]["schema"]["properties"]["spans"]
    labels = list(spans["items"]["properties"]["label"]["enum"])
    return labels, int(spans.get("maxItems", MAX_SPANS)), spans["items"]["properties"]["text"].get("maxLength")


def requested_span_limit(request: dict) -> int | None:
    """The most spans a chat-completions body asks for as a structured answer; None for a free-text one.

    Used by drlc's own backends that write spans they already know (lexicon, tagger): ``copy``'s
    ``drlc_copy`` field, else a ``json_schema`` ``response_format``.

    >>> requested_span_limit({"drlc_copy": {"max_spans": 3}}), requested_span_limit({"messages": []})
    (3, None)
    """
    copy = request.get("drlc_copy")
    if copy is not None:
        return int(copy.get("max_spans", MAX_SPANS))
    response_format = request.get("response_format") or {}
    if response_format.get("type") != "json_schema":
        return None
    return schema_bound(response_format)[1]


def constrained(body: dict) -> bool:
    """Whether a canonical body carries a constraint (json, copy or copy_words)."""
    return any(name in body for name in CONSTRAINT_FIELDS)


def constraint_for(request: dict) -> SpanAutomaton | None:
    """The automaton a chat-completions body asks for: ``drlc_copy`` (copy), a ``json_schema``
    ``response_format`` of drlc's span shape (json), or None.

    :raises CriticError: for a ``response_format``, ``grammar`` or ``drlc_copy`` this backend cannot honour
    """
    from pipeline.critic.offline.constrained import SpanAutomaton

    copy = request.get("drlc_copy")
    if copy is not None:
        if not (isinstance(copy, dict) and isinstance(copy.get("source"), str) and copy.get("labels")
                and isinstance(copy.get("max_spans"), int) and isinstance(copy.get("words", False), bool)
                and isinstance(copy.get("max_span_bytes", 1), int)):
            raise CriticError("drlc_copy must be {source: str, labels: [str], max_spans: int, words: bool "
                              "(optional), max_span_bytes: int (optional)}")
        return SpanAutomaton(copy["labels"], copy["max_spans"], copy["source"], words=copy.get("words", False),
                             max_span_bytes=copy.get("max_span_bytes"))
    if request.get("grammar") is not None:
        raise CriticError("drlc's hf backend does not read GBNF grammars; send drlc_copy (critic.answer_format: copy)")
    response_format = request.get("response_format")
    if response_format is None or response_format.get("type") == "text":
        return None
    try:
        labels, max_spans, max_chars = schema_bound(response_format)
        return SpanAutomaton(labels, max_spans, max_span_bytes=max_chars)
    except (KeyError, TypeError) as error:
        raise CriticError(f"drlc's hf backend honours only drlc's span json_schema response_format "
                          f"(critic.answer_format: json), not this one (missing {error})") from None


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
    labels, max_items, max_chars = schema_bound(response_format)
    return not _SchemaReader(text, labels, max_items, max_chars).fits(complete)


def _copied_exactly(text: str, copy: dict) -> bool:
    """A complete ``copy`` answer in the grammar's layout whose every span is copied (whitespace-only ones too)."""
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
            self.i += 1
        self.i += 1
        value = json.loads(self.text[start:self.i], strict=False)  # raw control characters: see read_structured
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
