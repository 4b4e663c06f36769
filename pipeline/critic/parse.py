"""The critic's answer format: read an answer into labelled items, and write drlc's own.

drlc's templates ask for one line per label, spans in double quotes separated by ``;``::

    Positive: "lovely"; "very kind"
    Negative: none

Real critics vary that layout, and the paper's prompts ask for another one, so
:func:`parse_answer` reads an answer with a small grammar instead of one pattern. An
answer is a sequence of lines (CRLF or LF, blank lines and Markdown code fences ignored),
each one of:

- a **header**: a short phrase that names one of the task's labels, closed by ``:``, a
  dash or an arrow, or written as a Markdown heading or a bold line (``Positive:``, ``Negative spans -``,
  ``Identified Negative Text Span:``, ``**Toxic spans:**``, ``### Irrelevant``). It sets the
  label of the items under it; text after the colon is read as items too. A short closed
  phrase without a label (``Problematic Spans Identified in the Summary:``) is a neutral
  header: it ends the previous block and keeps the current label.
- an **item**: a line opened by a marker (``[Span 1]:``, ``Span 1:``, ``Toxic Span 1:``,
  ``1.``, ``1)``, ``-``, ``*``, ``•``; a bullet may be followed by a bold span marker,
  ``- **Span 1:** text``, whose label, if it names one, wins) or by a quote, or a plain line right under a header
  whose colon ended the line. A quoted item holds one or more spans in any quote style
  (``"…"``, ``'…'``, ``“…”``, ``‘…’``, ``«…»``, backticks) separated by ``;``, ``,``, ``/``
  or "and"; anything after them is an explanation. An unquoted item is the text after the
  marker; its explanation (after `` - ``, `` (``, ``: `` ...) cannot be told from the span
  without the response, so the item carries shorter candidates for alignment to try (and
  its comma-separated parts, tried when no candidate is in the response). A per-item
  label (``(Label: Irrelevant)``, ``[incoherent]``, ``irrelevant: "…"``, ``"…" (negative)``,
  ``lovely: positive``, ``x — Irrelevant: why``) wins
  over the header's, also on the line after the item; an unknown one is kept as written.
  An item whose quote is left open, or an indented line under an unquoted item, continues
  onto the next line.
- a **none**: ``None identified``, ``none``, ``N/A``, ``(none)``, ``No toxic spans found``
  ... as a whole item or header text, or followed by its reason after ``:``, ``.``, `` - ``, `` — ``,
  ``;`` or `` (`` (``None identified - the sentence is polite.``). A span that merely starts with
  "None" (``None of your business``) is a span: the words before the first such break must say none.
- a **table row** ``| span | label |``: the cell that names a label labels the other one.
- anything else is prose and is skipped (a preamble, a note, a closing remark).

Items before the first header take ``leading_label``: the label of the prompt's last open
header (the paper's prompts end with ``Identified Positive Text Span:``, and the model
continues under it). A task with one label uses it for every unlabelled item. A JSON
object ``{label: [spans]}`` or list of ``{"label", "span"}`` objects is also read.

What one item says (quotes, per-item label, "none", candidates) is read by
:mod:`pipeline.critic.items`; this module finds the items.

Status: ``ok`` (at least one item), ``none`` (no item, and the answer says so explicitly),
``parse_error`` (content, but no item and no "none"). :func:`format_answer` writes drlc's
own form; the offline lexicon critic uses it, so its answers take the same path as an LLM's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pipeline.core.errors import ConfigError
from pipeline.critic.items import (
    BOLD,
    ITEM_LABEL,
    QUOTES,
    Item,
    canonical,
    closed_quotes,
    is_none,
    items_of,
    json_items,
    label_regex,
    strip_markup,
)

__all__ = ["Item", "ParsedAnswer", "parse_answer", "format_answer"]

_MARKER = re.compile(
    r"^(?:\[\s*(?P<b>[^\]\n]{0,40}?)\s*\]|(?P<s>(?:[a-z][\w-]*\s+){0,3}(?:span|item|phrase|segment)\s*#?\s*\d+|(?:span|item|phrase|segment)(?=\s*:))"
    r"|\(?\d{1,3}[.)]|[-*•·+–—>])\s*[:.)–—-]?\s+(?=\S)",
    re.IGNORECASE,
)
_HEADER_WORDS = 9
# where a "none" ends and its reason begins: "None identified - the sentence is polite."
_REASON_BREAK = re.compile(r"[.!;:](?=\s|$)|\s[-–—]+\s|\s\(")


def _says_none(text: str) -> bool:
    """``is_none(text)``, or a none followed by its reason (``None identified: the sentence is polite.``).

    Only the words before the first break are tested, so ``None of your business - idiot`` stays a span.
    """
    if is_none(text):
        return True
    bare = strip_markup(text)
    if bare[:1] in QUOTES:  # a quoted span is a span, even '"None. Get out."'
        return False
    cut = _REASON_BREAK.search(bare)
    return bool(cut) and bool(re.search(r"[^\W\d_]", bare[:cut.start()])) and is_none(bare[:cut.start()])


@dataclass(frozen=True)
class ParsedAnswer:
    """A critic answer read into labelled items.

    Attributes:
        status: ``"ok"`` (items read), ``"none"`` (explicitly nothing) or ``"parse_error"``.
        items: every item read, in answer order, duplicates removed.
        error: why parsing failed, or ``""``.
    """

    status: str
    items: tuple[Item, ...]
    error: str

    @property
    def spans(self) -> tuple[tuple[str, str], ...]:
        """``(label, text)`` of the items, in order."""
        return tuple((item.label, item.text) for item in self.items)


def parse_answer(text: str, *, labels: tuple[str, ...] | list[str], leading_label: str | None = None) -> ParsedAnswer:
    """Read a critic answer into labelled items.

    Params:
        text: the raw answer text.
        labels: the task's span labels (``Template.labels``), e.g. ``("positive", "negative")``.
        leading_label: the label of items before any header (``Template.leading_label``).
    Returns:
        A :class:`ParsedAnswer`.
    Raises:
        ConfigError: ``labels`` is empty or ``leading_label`` is not one of them.
    """
    labels = _check_labels(labels, leading_label)
    default = leading_label or (labels[0] if len(labels) == 1 else "")
    from_json = json_items(text or "", labels)
    if from_json is not None:
        return _result(from_json, said_none=True, labels=labels)
    reader = _Reader(labels, default)
    for line in _lines(text or "", labels) + [""]:  # the blank line closes the last item
        reader.feed(line)
    return _result(reader.items, said_none=reader.said_none, labels=labels, content=bool((text or "").strip()))


def format_answer(labels: tuple[str, ...] | list[str], spans) -> str:
    """Write spans in drlc's own answer format, which the ``prompts/*.md`` templates ask for.

    Params:
        labels: the task's span labels, in the order of the lines.
        spans: ``(label, span_text)`` pairs; span texts must not contain ``"``.
    Returns:
        One ``Label: "span"; "span"`` (or ``Label: none``) line per label.
    Raises:
        ConfigError: a span's label is not in ``labels``, or a span is empty or quoted.
    """
    labels = _check_labels(labels, None)
    by_label: dict[str, list[str]] = {label: [] for label in labels}
    for label, span in spans:
        if label not in by_label:
            raise ConfigError(f"unknown label {label!r}; valid labels: {list(labels)}")
        if not span.strip() or '"' in span:
            raise ConfigError(f"span {span!r} cannot be written: it is empty or contains a double quote")
        by_label[label].append(span)
    lines = []
    for label in labels:
        items = "; ".join(f'"{span}"' for span in by_label[label]) or "none"
        lines.append(f"{label[0].upper() + label[1:]}: {items}")
    return "\n".join(lines)


def _check_labels(labels, leading_label) -> tuple[str, ...]:
    labels = tuple(str(label).strip().lower() for label in labels)
    if not labels or not all(labels):
        raise ConfigError(f"a critic answer needs the task's span labels, got {labels!r}; pass template.labels")
    if leading_label is not None and leading_label not in labels:
        raise ConfigError(f"leading_label {leading_label!r} is not one of the labels {list(labels)}")
    return labels


def _result(items: list[Item], *, said_none: bool, labels, content: bool = True) -> ParsedAnswer:
    unique = list({(item.label, item.text): item for item in items[::-1]}.values())[::-1]
    if unique:
        return ParsedAnswer(status="ok", items=tuple(unique), error="")
    if said_none or not content:
        return ParsedAnswer(status="none" if said_none else "parse_error", items=(),
                            error="" if said_none else "the answer is empty")
    shown = ", ".join(f"'{label.capitalize()}:'" for label in labels)
    return ParsedAnswer(status="parse_error", items=(),
                        error=f"no item and no 'none' found; expected {shown} header lines or '[Span N]:' items")


# --- lines ------------------------------------------------------------------------------------

def _lines(text: str, labels: tuple[str, ...]) -> list[str]:
    """Split into lines, drop code fences, and put each inline ``Label:`` on a line of its own."""
    out = []
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if line.strip().startswith("```"):
            continue
        out.extend(_split_inline_labels(line, labels))
    return out


def _split_inline_labels(line: str, labels: tuple[str, ...]) -> list[str]:
    """``Positive: "a", Negative: "b"`` -> two lines (cuts outside quotes only)."""
    pattern = re.compile(rf"(?<=[\"”’'\w.])[\s;,|]+(?=(?:\*\*)?{label_regex(labels)}(?:\s+spans?)?(?:\*\*)?\s*:)",
                         re.IGNORECASE)
    cuts = [m for m in pattern.finditer(line) if _outside_quotes(line, m.start())]
    pieces, end = [], len(line)
    for m in reversed(cuts):
        pieces.append(line[m.end():end])
        end = m.start()
    return [line[:end]] + pieces[::-1]


def _outside_quotes(line: str, position: int) -> bool:
    return sum(line[:position].count(q) for q in '"“”«»') % 2 == 0


# --- the reader -------------------------------------------------------------------------------

class _Reader:
    """Reads lines one at a time, keeping the current label and whether plain lines are items."""

    def __init__(self, labels: tuple[str, ...], default: str):
        self.labels, self.label = labels, default
        self.header = re.compile(
            rf"^(?P<head>[^\"“”«:\n]{{0,120}}?{label_regex(labels)}[^\"“”«:\n]{{0,80}}?)"
            r"(?:\s*(?P<sep>[:：]|->|=>|→|[-–—](?=\s|$))\s*(?P<rest>.*)|\s*)$", re.IGNORECASE)
        self.items: list[Item] = []
        self.said_none = False
        self.plain_ok = False  # a plain line is an item: under a header whose colon ended the line
        self.block_items = 0  # items since the last header
        self.open: tuple[str, str, bool] | None = None  # (label, text, split on ";") of an item being read
        self.open_quoted = False  # its quote is still open

    def feed(self, raw: str) -> None:
        line = BOLD.sub("", raw).strip() if raw.strip().startswith("**") else raw.strip()
        if self.open is not None and self._continues(raw, line):
            return
        self._close()
        if not line:
            self.plain_ok = self.plain_ok and not self.block_items
            return
        if line.startswith("|"):
            self._table_row(line)
            return
        heading = line.startswith("#") or raw.strip().startswith("**")
        body = line.lstrip("#").strip()
        marker = _MARKER.match(body)
        if marker and self._item_marker(marker):
            rest, label = body[marker.end():], self._marker_label(marker, self.label)
            while True:  # "1. Span 1: ..." and "- **Span 1:** ..." have two markers; the inner one's label wins
                unbolded = BOLD.sub("", rest).strip() if rest.startswith("**") else rest
                inner = _MARKER.match(unbolded)
                if not (inner and inner.group("s")):
                    break
                rest, label = unbolded[inner.end():], self._marker_label(inner, label)
            if not self._header(rest, heading=False):
                self._start_item(rest, label=label)
            return
        if _says_none(body):
            self.said_none = True
            self.block_items += 1  # the block's answer: a later plain line is not its item
        elif self._header(body, heading=heading):
            return
        elif body[:1] in QUOTES:
            self._start_item(body, label=self.label)
        elif self.plain_ok and len(body.split()) <= 40 and not re.match(r"^[A-Z][\w ]{0,24}:\s+\S", body):
            self._start_item(body, label=self.label)
        elif re.match(r"^[^\"“”:]{1,80}:\s*$", body):
            self.plain_ok, self.block_items = True, 0  # a neutral header: "Problematic Spans Identified ...:"
        else:
            self.plain_ok = False  # prose

    def _table_row(self, line: str) -> None:
        """A Markdown table row: a cell naming a label labels the row's first other cell."""
        cells = [strip_markup(cell) for cell in line.strip().strip("|").split("|")]
        named = [cell for cell in cells if canonical(cell, self.labels) in self.labels]
        spans = [cell for cell in cells if cell and cell not in named and not set(cell) <= set("-: ")]
        if named and spans and not re.fullmatch(r"(?:span|text|phrase)s?", spans[0], re.IGNORECASE):
            self._start_item(spans[0], label=canonical(named[0], self.labels))
            self._close()

    def _item_marker(self, marker: re.Match) -> bool:
        bracket = marker.group("b")
        return bracket is None or bool(re.match(r"^(?:[\w-]+\s+){0,3}(?:span|item|phrase)?\s*#?\s*\d+$", bracket, re.I))

    def _marker_label(self, marker: re.Match, default: str) -> str:
        named = marker.group("s") or marker.group("b") or ""
        found = re.search(label_regex(self.labels), named, re.IGNORECASE)
        return canonical(found.group(), self.labels) if found else default

    def _header(self, body: str, *, heading: bool) -> bool:
        """Read ``body`` as a header naming a label (and the items after its colon); return whether it is one."""
        match = self.header.match(BOLD.sub("", body))
        if not match:
            return False
        head, rest = match.group("head").strip(" *_#>"), (match.group("rest") or "").strip().strip("*_").strip()
        words = len(head.split())
        if words > (_HEADER_WORDS if not rest or rest[:1] in QUOTES else 6):
            return False
        if not match.group("sep") and not heading and words > 3:
            return False
        found = re.search(label_regex(self.labels), head, re.IGNORECASE)
        before = head[:found.start()]
        if len(before.split()) > 3 or re.search(r"[-–—*]\s|\s[-–—*]", before):  # "a pool — *Irrelevant*: why"
            return False
        self.label = canonical(found.group(), self.labels)
        self.plain_ok, self.block_items = not rest, 0
        if rest and _says_none(rest):
            self.said_none = True
        elif rest:
            self._start_item(rest, label=self.label, split=True)
        return True

    def _start_item(self, text: str, *, label: str, split: bool = False) -> None:
        text = BOLD.sub("", text).strip()
        if _says_none(text):
            self.said_none = True
            return
        self.block_items += 1
        self.open = (label, text, split)
        self.open_quoted = text[:1] in QUOTES and not closed_quotes(text)

    def _continues(self, raw: str, line: str) -> bool:
        """Add ``line`` to the open item when that item wraps onto it; return whether it did."""
        label, text, split = self.open
        if self.open_quoted:
            if not line:
                return False
            self.open = (label, f"{text} {line}", split)
            self.open_quoted = not closed_quotes(self.open[1])
            return True
        if ITEM_LABEL.fullmatch(line):  # the item's label on a line of its own
            self.open = (label, f"{text} {line}", split)
            return True
        indented = raw[:1].isspace() and line and not _MARKER.match(line) and line[:1] not in QUOTES
        if indented and text[:1] not in QUOTES and not _says_none(line):
            self.open = (label, f"{text} {line}", split)
            return True
        return False

    def _close(self) -> None:
        if self.open is not None:
            label, text, split = self.open
            self.open, self.open_quoted = None, False
            self.items.extend(items_of(text, label, self.labels, split_plain=split))


