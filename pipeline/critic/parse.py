"""The critic's answer format: read an answer into labelled spans, and write one.

Every template asks for one line per label, spans in double quotes separated by ``;``::

    Positive: "lovely"; "very kind"
    Negative: none

:func:`parse_answer` is tolerant of what real LLMs do with that format: any letter case,
bullets or numbering before a label, Markdown bold, ``Negative spans:``, several quote
styles (``"…"``, ``'…'``, ``“…”``, ``‘…’``), spans separated by ``;`` or ``,`` or listed
one per line under an empty label line, trailing commentary, and "none"-style answers
("None identified", "N/A", "no negative spans"). Unquoted text after a label is read as
spans split on ``;``. An answer with no label line (and not a bare "none") is a
``parse_error`` with no spans: it is never rewarded as one big span.

:func:`format_answer` writes the canonical form; the offline lexicon critic uses it so
that its answers go through the same parser as an LLM's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pipeline.errors import ConfigError

__all__ = ["TASK_LABELS", "ParsedAnswer", "parse_answer", "format_answer"]

TASK_LABELS: dict[str, tuple[str, ...]] = {
    "sentiment": ("positive", "negative"),
    "toxicity": ("toxic",),
    "summarization": ("irrelevant", "incoherent", "factually incorrect"),
}

_BULLET = r"(?:[-*•·+>]|\d+[.)])"
_QUOTED = re.compile(r"[\"“”„«](?P<double>.+?)[\"“”»]|(?<!\w)['‘’](?P<single>.+?)['‘’](?!\w)")
_STARTS_QUOTED = re.compile(rf"^\s*(?:{_BULLET}\s*)?[\"“”„«'‘’]")
_BULLET_LINE = re.compile(rf"^\s*{_BULLET}\s+(?P<item>\S.*)$")
_NONE_LIKE = re.compile(
    r"^(?:none|nothing|nil|n/?a\b|not applicable|no\b|there (?:are|is|were|was) no\b|-+$|—$|$)", re.IGNORECASE
)
_BARE_NONE = re.compile(
    r"^(?:none|nothing|n/?a)\b|^no (?:\w+ ){0,3}(?:spans?|words?|phrases?|content|parts?|issues?)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class ParsedAnswer:
    """A critic answer read into labelled spans.

    Attributes:
        status: ``"ok"`` or ``"parse_error"``.
        spans: ``(label, span_text)`` pairs, label as in :data:`TASK_LABELS`, in answer
            order, duplicates removed; empty on a parse error.
        error: why parsing failed, or ``""``.
    """

    status: str
    spans: tuple[tuple[str, str], ...]
    error: str


def parse_answer(task: str, text: str) -> ParsedAnswer:
    """Read a critic answer into labelled spans.

    Params:
        task: one of :data:`TASK_LABELS`.
        text: the raw answer text.
    Returns:
        A :class:`ParsedAnswer`; ``status="parse_error"`` and no spans when no label line
        is found and the answer is not a bare "none".
    Raises:
        ConfigError: ``task`` is unknown.
    """
    labels = _labels_for(task)
    label_line = _label_line_pattern(labels)
    lines = _split_inline_labels(text or "", labels).split("\n")
    spans: list[tuple[str, str]] = []
    found_label = False
    i = 0
    while i < len(lines):
        match = label_line.match(lines[i])
        i += 1
        if not match:
            continue
        found_label = True
        label = _canonical_label(match.group("label"), labels)
        rest = match.group("rest").strip().strip("*_").strip()
        items = _spans_in(rest)
        if not items and not _NONE_LIKE.match(rest):
            items = _unquoted_spans(rest)
        continuation, i = _continuation_spans(lines, i, label_line, allow_unquoted=not rest)
        spans.extend((label, item) for item in items + continuation)
    if not found_label:
        if _BARE_NONE.match(_strip_markup(text or "")) and not _QUOTED.search(text or ""):
            return ParsedAnswer(status="ok", spans=(), error="")
        expected = ", ".join(f"'{_display(label)}:'" for label in labels)
        return ParsedAnswer(status="parse_error", spans=(), error=f"no {expected} line found in the answer")
    return ParsedAnswer(status="ok", spans=tuple(dict.fromkeys(spans)), error="")


def format_answer(task: str, spans: list[tuple[str, str]] | tuple[tuple[str, str], ...]) -> str:
    """Write spans in the canonical answer format that every template asks for.

    Params:
        task: one of :data:`TASK_LABELS`.
        spans: ``(label, span_text)`` pairs; span texts must not contain ``"``.
    Returns:
        One ``Label: "span"; "span"`` (or ``Label: none``) line per label of the task.
    Raises:
        ConfigError: the task or a span's label is unknown, or a span is empty or quoted.
    """
    labels = _labels_for(task)
    by_label: dict[str, list[str]] = {label: [] for label in labels}
    for label, span in spans:
        if label not in by_label:
            raise ConfigError(f"unknown label {label!r} for task {task!r}; valid labels: {list(labels)}")
        if not span.strip() or '"' in span:
            raise ConfigError(f"span {span!r} cannot be written: it is empty or contains a double quote")
        by_label[label].append(span)
    lines = []
    for label in labels:
        items = "; ".join(f'"{span}"' for span in by_label[label]) or "none"
        lines.append(f"{_display(label)}: {items}")
    return "\n".join(lines)


def _labels_for(task: str) -> tuple[str, ...]:
    if task not in TASK_LABELS:
        raise ConfigError(f"unknown critic task {task!r}; valid tasks: {sorted(TASK_LABELS)}")
    return TASK_LABELS[task]


def _display(label: str) -> str:
    return label[0].upper() + label[1:]


def _label_regex(labels: tuple[str, ...]) -> str:
    words = ["[\\s_-]+".join(re.escape(word) for word in label.split()) for label in labels]
    return "(?:" + "|".join(words) + ")"


def _label_line_pattern(labels: tuple[str, ...]) -> re.Pattern:
    return re.compile(
        rf"^\s*(?:{_BULLET}\s*)?[*_]{{0,2}}\s*(?P<label>{_label_regex(labels)})"
        r"(?:[\s_-]+(?:spans?|phrases?|words?|parts?))?\s*[*_]{0,2}\s*[:：]\s*[*_]{0,2}(?P<rest>.*)$",
        re.IGNORECASE,
    )


def _canonical_label(written: str, labels: tuple[str, ...]) -> str:
    normal = re.sub(r"[\s_-]+", " ", written.lower()).strip()
    assert normal in labels, (written, labels)
    return normal


def _split_inline_labels(text: str, labels: tuple[str, ...]) -> str:
    """Put each ``Label:`` that follows other text on a line of its own (outside quotes)."""
    pattern = re.compile(rf"(?<=\S)[\s;,|]*(?=\b{_label_regex(labels)}(?:\s+spans?)?\s*:)", re.IGNORECASE)
    out_lines = []
    for line in text.split("\n"):
        cuts = [m for m in pattern.finditer(line) if _outside_quotes(line, m.start())]
        for m in reversed(cuts):
            line = line[: m.start()] + "\n" + line[m.end() :]
        out_lines.append(line)
    return "\n".join(out_lines)


def _outside_quotes(line: str, position: int) -> bool:
    return sum(line[:position].count(q) for q in '"“”') % 2 == 0


def _spans_in(text: str) -> list[str]:
    """Return the quoted spans in a piece of an answer, in order, without empty ones."""
    spans = []
    for match in _QUOTED.finditer(text):
        span = (match.group("double") or match.group("single") or "").strip()
        if span:
            spans.append(span)
    return spans


def _unquoted_spans(rest: str) -> list[str]:
    """Read unquoted text after a label as spans split on ``;``."""
    items = [item.strip().rstrip(".").strip() for item in rest.split(";")]
    return [item for item in items if item]


def _continuation_spans(lines: list[str], i: int, label_line: re.Pattern, *, allow_unquoted: bool):
    """Collect spans listed on the lines after a label line; return them and the next line index."""
    spans: list[str] = []
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        if label_line.match(line):
            break
        if _STARTS_QUOTED.match(line) and _spans_in(line):
            spans.extend(_spans_in(line))
        elif allow_unquoted and (bullet := _BULLET_LINE.match(line)):
            item = _strip_markup(bullet.group("item"))
            if not _NONE_LIKE.match(item):
                spans.extend(_unquoted_spans(item))
        else:
            break
        i += 1
    return spans, i


def _strip_markup(text: str) -> str:
    return text.strip().strip("*_").strip()
