"""The ``copy`` answer as a GBNF grammar (llama.cpp's ``grammar`` field), and a check of GBNF text before it is sent.

A ``copy`` answer is drlc's span JSON written in one fixed layout::

    {"spans": [{"label": "toxic", "text": "<a substring of the response>"}, ...]}

Span texts are JSON strings, so they are substrings of the response *as JSON-escaped*: the
response is cut into units, one per character, each the character's JSON encoding
(``"`` is ``\\"``, a newline ``\\n``); a span is a non-empty run of consecutive units. The
grammar has one rule per start position, each unit optionally followed by the rule of the
next one, so the grammar grows linearly with the response. :mod:`pipeline.critic.offline.constrained`
decodes under the same language in drlc's own ``hf`` backend.

A malformed grammar crashes llama.cpp's server process, so :func:`check_gbnf` validates
grammar text (literals, escapes, brackets, every referenced rule defined, a ``root``)
before a request carries it.
"""

from __future__ import annotations

import json
import re

from pipeline.core.errors import ConfigError

__all__ = [
    "CLOSE",
    "ITEM_CLOSE",
    "ITEM_MID",
    "ITEM_OPEN",
    "OPEN",
    "SEPARATOR",
    "check_gbnf",
    "copy_grammar",
    "json_units",
    "span_bounds",
]

OPEN, CLOSE, SEPARATOR = '{"spans": [', "]}", ", "
ITEM_OPEN, ITEM_MID, ITEM_CLOSE = '{"label": "', '", "text": "', '"}'

_NAME = re.compile(r"[a-zA-Z0-9-]+")
_ESCAPE = re.compile(r'\\(?:[\\"nrt\[\]]|x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8})')


def json_units(text: str) -> list[str]:
    """Each character of ``text`` as it is written inside a JSON string (``ensure_ascii=False``).

    >>> json_units('a"\\n')
    ['a', '\\\\"', '\\\\n']
    """
    return [json.dumps(ch, ensure_ascii=False)[1:-1] for ch in text]


def span_bounds(source: str, words: bool) -> tuple[list[int], set[int]]:
    """Where a copied span may start and end in ``source`` (character offsets; ends are exclusive).

    Character spans (``copy``) start at any character and end after any. Word spans
    (``copy_words``) start at the first character of a word and end after the last character
    of a word, a word being a run of letters, digits and ``_``; so a span is whole words and
    whatever lies between them.

    >>> span_bounds("Hi, you!", words=True)
    ([0, 4], {2, 7})
    """
    if not words:
        return list(range(len(source))), set(range(1, len(source) + 1))
    word = [ch.isalnum() or ch == "_" for ch in source]
    starts = [i for i, w in enumerate(word) if w and (i == 0 or not word[i - 1])]
    ends = {i + 1 for i, w in enumerate(word) if w and (i + 1 == len(word) or not word[i + 1])}
    return starts, ends


def _literal(text: str) -> str:
    """``text`` as a GBNF string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r") + '"'


def copy_grammar(source: str, labels, *, max_spans: int, words: bool = False, max_span_bytes: int | None = None) -> str:
    """GBNF for a ``copy`` answer: at most ``max_spans`` spans, each labelled and a substring of ``source``.

    :param words: spans start and end at word edges (``copy_words``, :func:`span_bounds`)
    :param max_span_bytes: most UTF-8 bytes of one span's JSON-escaped text (the answer bound,
        :func:`pipeline.critic.structured.answer_bound`); None: any length (the chained rules below)
    :raises ConfigError: on no labels or ``max_spans < 1``
    """
    labels = [str(label) for label in labels]
    if not labels or max_spans < 1:
        raise ConfigError(f"a copy grammar needs labels and max_spans >= 1, got {labels!r} and {max_spans}")
    units = json_units(source)
    starts, ends = span_bounds(source, words)
    if not starts:  # nothing to copy from: only the empty answer
        return f"root ::= {_literal(OPEN + CLOSE)}\n"
    rules = [f"root ::= {_literal(OPEN)} ( {_literal(CLOSE)} | item tail1? {_literal(CLOSE)} )"]
    rules.append(f"item ::= {_literal(ITEM_OPEN)} label {_literal(ITEM_MID)} text {_literal(ITEM_CLOSE)}")
    for k in range(1, max_spans):
        more = f" tail{k + 1}?" if k + 1 < max_spans else ""
        rules.append(f"tail{k} ::= {_literal(SEPARATOR)} item{more}")
    if max_spans == 1:
        rules[0] = f"root ::= {_literal(OPEN)} ( {_literal(CLOSE)} | item {_literal(CLOSE)} )"
    rules.append("label ::= " + " | ".join(_literal(label) for label in labels))
    if max_span_bytes is not None:
        spans = {i: rule for i in starts if (rule := _bounded_span(units, i, ends, max_span_bytes))}
        if not spans:  # no span fits the bound: only the empty answer
            return f"root ::= {_literal(OPEN + CLOSE)}\n"
        rules.append("text ::= " + " | ".join(f"s{i}" for i in spans))
        rules += [f"s{i} ::= {rule}" for i, rule in spans.items()]
        grammar = "\n".join(rules) + "\n"
        check_gbnf(grammar)
        return grammar
    rules.append("text ::= " + " | ".join(f"s{i}" for i in starts))
    last = max(ends)
    for i in range(starts[0], last):  # s_i: the span from character i on, to an end
        more = "" if i + 1 == last else f" s{i + 1}" + ("?" if i + 1 in ends else "")
        rules.append(f"s{i} ::= {_literal(units[i])}{more}")
    grammar = "\n".join(rules) + "\n"
    check_gbnf(grammar)
    return grammar


def _bounded_span(units: list[str], start: int, ends: set[int], limit: int) -> str:
    """GBNF body of the spans from character ``start`` that end at an end within ``limit`` bytes ("" if none).

    One nested expression, innermost last: each unit is followed by the rest, optional where a span may end.

    >>> _bounded_span(list("abc"), 0, {1, 3}, 2)
    '"a"'
    >>> _bounded_span(list("abc"), 0, {1, 3}, 3)
    '"a" ( "b" ( "c" ) )?'
    """
    size, last, j = 0, None, start
    while j < len(units):
        size += len(units[j].encode())
        if size > limit:
            break
        j += 1
        if j in ends:
            last = j
    if last is None:
        return ""
    body = _literal(units[last - 1])
    for k in range(last - 2, start - 1, -1):
        body = f"{_literal(units[k])} ( {body} )" + ("?" if k + 1 in ends else "")
    return body


def check_gbnf(grammar: str) -> None:
    """Raise ConfigError (one line) unless ``grammar`` is well-formed GBNF with one rule per line.

    Checked: ``name ::= body`` lines, unique rule names, a ``root`` rule, closed string
    literals with valid escapes, closed ``[...]`` classes, balanced parentheses, and every
    referenced rule defined.
    """
    defined, used = [], set()
    for number, line in enumerate(grammar.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, body = line.partition("::=")
        name = name.strip()
        if not sep or not _NAME.fullmatch(name):
            raise ConfigError(f"GBNF line {number} is not 'name ::= body': {line[:80]!r}")
        if name in defined:
            raise ConfigError(f"GBNF rule {name!r} is defined twice (line {number})")
        defined.append(name)
        used |= _references(body, number)
    if "root" not in defined:
        raise ConfigError("GBNF grammar has no 'root' rule")
    missing = sorted(used - set(defined))
    if missing:
        raise ConfigError(f"GBNF grammar references undefined rule(s) {missing[:5]}")


def _references(body: str, number: int) -> set[str]:
    """The rule names ``body`` uses; raises ConfigError on a malformed literal, class or bracket."""
    names, depth, i = set(), 0, 0
    while i < len(body):
        ch = body[i]
        if ch in " \t":
            i += 1
        elif ch in '"[':
            i = _skip_quoted(body, i, number)
        elif ch == "(":
            depth, i = depth + 1, i + 1
        elif ch == ")":
            depth, i = depth - 1, i + 1
            if depth < 0:
                raise ConfigError(f"GBNF line {number}: ')' without '('")
        elif ch in "|?*+":
            i += 1
        elif match := _NAME.match(body, i):
            names.add(match.group())
            i = match.end()
        else:
            raise ConfigError(f"GBNF line {number}: unexpected {ch!r} at column {i}")
    if depth:
        raise ConfigError(f"GBNF line {number}: '(' without ')'")
    return names


def _skip_quoted(body: str, start: int, number: int) -> int:
    """Index after the literal or class opened at ``start``."""
    close = '"' if body[start] == '"' else "]"
    i = start + 1
    while i < len(body):
        if body[i] == "\\":
            escape = _ESCAPE.match(body, i)
            if not escape:
                raise ConfigError(f"GBNF line {number}: bad escape {body[i:i + 2]!r} at column {i}")
            i = escape.end()
        elif body[i] == close:
            return i + 1
        elif body[i] in "\n\r":
            break
        else:
            i += 1
    raise ConfigError(f"GBNF line {number}: {body[start]!r} at column {start} is never closed")
