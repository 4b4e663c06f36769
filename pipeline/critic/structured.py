"""Structured critic answers (``critic.answer_format``): a JSON schema of labelled spans, how it is asked for, how it is read.

``text`` (the default) is drlc's free-text answer, read by :mod:`pipeline.critic.parse`.
``json`` and ``copy`` ask for one JSON object::

    {"spans": [{"label": "toxic", "text": "you absolute clown"}]}

with ``label`` one of the template's labels and at most :data:`MAX_SPANS` spans:

- ``json`` sends the schema as OpenAI's strict ``response_format`` (``json_schema``), which
  OpenAI, SGLang and drlc's own server honour;
- ``copy`` also restricts every span's ``text`` to a substring of the response: drlc's
  server decodes under that constraint (its ``drlc_copy`` body field, see
  :mod:`pipeline.critic.offline.constrained`), and llama.cpp-style servers get the same
  constraint as a GBNF ``grammar`` (:mod:`pipeline.critic.grammar`). No ``response_format``
  is sent with ``copy``: llama.cpp's server answers the ``json_schema`` type with HTTP 500;
- ``copy_words`` is ``copy`` with spans that start and end at word edges
  (:func:`pipeline.critic.grammar.span_bounds`), so a span cannot be a stray letter or half a
  word.

These are the canonical bodies, built (and bounded by ``critic.max_tokens``) in
:mod:`pipeline.critic.constraint`; the client rewrites them for the server it talks to (vLLM's
``structured_outputs``, SGLang's ``ebnf``: :mod:`pipeline.critic.servers`, ``critic.server``).

Either way the last user message gets one more paragraph asking for the structure in words
(:func:`instruction`), so an endpoint that ignores the schema usually still complies. The
request fields are part of the cache key (they go through the client's per-request body).

:func:`read_structured` reads an answer: the JSON object if the answer is one (code fences
allowed), else the free-text parser as a fallback; an answer that is neither is
``parse_error`` with the JSON error, never silently empty.
"""

from __future__ import annotations

import json
import re

from pipeline.core.errors import ConfigError
from pipeline.critic.constraint import (ANSWER_FORMATS, MAX_SPANS, SCHEMA_NAME, check_format, request_body,
                                        requested_span_limit, span_schema)
from pipeline.critic.items import Item, canonical
from pipeline.critic.parse import ParsedAnswer, parse_answer

__all__ = ["ANSWER_FORMATS", "MAX_SPANS", "SCHEMA_NAME", "check_format", "instruction", "read_structured",
           "request_body", "requested_span_limit", "shape_requests", "span_schema", "spans_json", "with_instruction"]
# ANSWER_FORMATS ... span_schema: the constraint's builders, from pipeline.critic.constraint (imported from here before)

_FENCE = re.compile(r"^```\w*\s*|\s*```$")


def instruction(labels, *, answer_format: str, max_spans: int = MAX_SPANS) -> str:
    """The paragraph that asks for the JSON structure in words (drlc's own wording)."""
    shown = " or ".join(json.dumps(str(label)) for label in labels)
    source = {"copy": "a part of the text, copied character for character",
              "copy_words": "one or more whole words of the text, copied character for character",
              }.get(answer_format, "the span, copied from the text")
    return (f"Answer format for this reply: instead of the lines described above, write one JSON object and "
            f'nothing else, of the form {{"spans": [{{"label": <label>, "text": <span>}}]}}, where <label> is '
            f"{shown} and <span> is {source}. List at most {max_spans} spans; when there is none, write "
            f'{{"spans": []}}.')


def with_instruction(messages: list[dict], text: str) -> list[dict]:
    """``messages`` with ``text`` appended, after a blank line, to the last user message (a new list)."""
    out = [dict(m) for m in messages]
    last = max((i for i, m in enumerate(out) if m.get("role") == "user"), default=None)
    if last is None or not isinstance(out[last].get("content"), str):
        raise ConfigError("critic.answer_format json/copy needs a user message with text content in the template")
    out[last]["content"] = f"{out[last]['content'].rstrip()}\n\n{text}"
    return out


def shape_requests(requests: list[list[dict]], sources: list[str], *, labels,
                   answer_format: str) -> tuple[list[list[dict]], list[dict]]:
    """Rendered requests as ``answer_format`` sends them: (messages with the instruction, body fields).

    ``text`` returns the requests unchanged and empty bodies, so its cache keys are today's.

    :param sources: per request, the critiqued response (what ``copy`` spans are copied from)
    """
    check_format(answer_format)
    if answer_format == "text":
        return requests, [{} for _ in requests]
    line = instruction(labels, answer_format=answer_format)
    return ([with_instruction(messages, line) for messages in requests],
            [request_body(answer_format, labels, source=source) for source in sources])


def spans_json(spans, limit: int) -> str:
    """A structured answer holding the first ``limit`` of ``spans`` ((label, text) pairs).

    >>> spans_json([("toxic", "clown"), ("toxic", "fool")], 1)
    '{"spans": [{"label": "toxic", "text": "clown"}]}'
    """
    return json.dumps({"spans": [{"label": label, "text": text} for label, text in list(spans)[:limit]]},
                      ensure_ascii=False)


def read_structured(text: str, *, labels, leading_label: str | None = None) -> ParsedAnswer:
    """Read a structured answer; fall back to :func:`pipeline.critic.parse.parse_answer`.

    ``{"spans": []}`` is ``none``; an answer that is neither the JSON object nor free text
    with items is ``parse_error`` and its error names the JSON problem. Control characters
    inside strings are read as they are (``strict=False``): xgrammar, behind vLLM and SGLang,
    writes a span text with a ``maxLength`` (the answer bound) as any characters but ``"``,
    ``\\``, CR and LF, so a raw tab is an answer of the schema as the server applied it.
    """
    labels = tuple(str(label).strip().lower() for label in labels)
    stripped = _FENCE.sub("", (text or "").strip())
    try:
        data = json.loads(stripped, strict=False)  # xgrammar's bounded strings admit a raw tab (vLLM, SGLang)
    except ValueError as error:
        fallback = parse_answer(text, labels=labels, leading_label=leading_label)
        if fallback.status != "parse_error":
            return fallback
        return ParsedAnswer("parse_error", (), f"not valid JSON ({error}); free-text reading found no item either")
    spans = data.get("spans") if isinstance(data, dict) else None
    if not isinstance(spans, list):
        return ParsedAnswer("parse_error", (), 'JSON answer has no "spans" list')
    items = []
    for entry in spans:
        if not isinstance(entry, dict) or not isinstance(entry.get("text"), str) or not entry["text"].strip():
            continue
        label = canonical(str(entry.get("label", "")), labels)
        items.append(Item(label, entry["text"], (entry["text"],)))
    unique = tuple(dict.fromkeys(items))
    if unique:
        return ParsedAnswer("ok", unique, "")
    if spans:
        return ParsedAnswer("parse_error", (), f'JSON answer has {len(spans)} span(s) but none with a "text" string')
    return ParsedAnswer("none", (), "")
