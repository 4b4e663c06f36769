"""The critic's answer format: read an answer into labelled items, and write drlc's own.

drlc's templates ask for one line per label, spans in double quotes separated by ``;``::

    Positive: "lovely"; "very kind"
    Negative: none

Real critics vary that layout, and the paper's prompts ask for another one, so
:func:`parse_answer` reads an answer with a small grammar instead of one pattern. An
answer is a sequence of lines (CRLF or LF, blank lines and Markdown code fences ignored),
each one of:

- a **header**: a short phrase that names one of the task's labels, closed by ``:`` or a
  dash, or written as a Markdown heading or a bold line (``Positive:``, ``Negative spans -``,
  ``Identified Negative Text Span:``, ``**Toxic spans:**``, ``### Irrelevant``). It sets the
  label of the items under it; text after the colon is read as items too. A short closed
  phrase without a label (``Problematic Spans Identified in the Summary:``) is a neutral
  header: it ends the previous block and keeps the current label.
- an **item**: a line opened by a marker (``[Span 1]:``, ``Span 1:``, ``Toxic Span 1:``,
  ``1.``, ``1)``, ``-``, ``*``, ``•``) or by a quote, or a plain line right under a header
  whose colon ended the line. A quoted item holds one or more spans in any quote style
  (``"…"``, ``'…'``, ``“…”``, ``‘…’``, ``«…»``, backticks) separated by ``;``, ``,``, ``/``
  or "and"; anything after them is an explanation. An unquoted item is the text after the
  marker; its explanation (after `` - ``, `` (``, ``: `` ...) cannot be told from the span
  without the response, so the item carries shorter candidates for alignment to try.
  A per-item label (``(Label: Irrelevant)``, ``[incoherent]``, ``irrelevant: "…"``) wins
  over the header's, also on the line after the item; an unknown one is kept as written.
  An item whose quote is left open, or an indented line under an unquoted item, continues
  onto the next line.
- a **none**: ``None identified``, ``none``, ``N/A``, ``(none)``, ``No toxic spans found``
  ... as a whole item or header text. A span that merely starts with "None" is a span.
- a **table row** ``| span | label |``: the cell that names a label labels the other one.
- anything else is prose and is skipped (a preamble, a note, a closing remark).

Items before the first header take ``leading_label``: the label of the prompt's last open
header (the paper's prompts end with ``Identified Positive Text Span:``, and the model
continues under it). A task with one label uses it for every unlabelled item. A JSON
object ``{label: [spans]}`` or list of ``{"label", "span"}`` objects is also read.

Status: ``ok`` (at least one item), ``none`` (no item, and the answer says so explicitly),
``parse_error`` (content, but no item and no "none"). :func:`format_answer` writes drlc's
own form; the offline lexicon critic uses it, so its answers take the same path as an LLM's.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from pipeline.errors import ConfigError

__all__ = ["Item", "ParsedAnswer", "parse_answer", "format_answer"]

_OPEN_QUOTES = {'"': '"', "“": "”", "”": "”", "„": "“", "«": "»", "'": "'", "‘": "’", "’": "’", "`": "`"}
_MARKER = re.compile(
    r"^(?:\[\s*(?P<b>[^\]\n]{0,40}?)\s*\]|(?P<s>(?:[a-z][\w-]*\s+){0,3}(?:span|item|phrase|segment)\s*#?\s*\d+|(?:span|item|phrase|segment)(?=\s*:))"
    r"|\(?\d{1,3}[.)]|[-*•·+–—>])\s*[:.)–—-]?\s+(?=\S)",
    re.IGNORECASE,
)
_FOUND = r"(?:\s+(?:were\s+|was\s+|are\s+|is\s+)?(?:identified|found|detected|present|flagged))"
_NONE = re.compile(
    r"^(?:none(?:\s+(?:identified|found|detected|given|present))?|nothing(?:\s+(?:identified|found))?|nil|null"
    r"|n/?a|not applicable|-+|—|\[\s*\]"
    rf"|no\s+(?:[\w-]+\s+){{0,3}}(?:spans?|words?|phrases?|segments?){_FOUND}?"
    rf"|no\s+(?:[\w-]+\s+){{0,3}}(?:content|language|issues?|problems?|flaws?|errors?){_FOUND}"
    r"|there (?:are|is|were|was) no\s+(?:[\w-]+\s+){0,3}(?:spans?|words?|phrases?|content|language|issues?|flaws?)"
    r"(?:\s+\w+){0,3})$",
    re.IGNORECASE,
)
_ITEM_LABEL = re.compile(
    r"[(\[]\s*(?:label|type|category|tag)\s*[:=-]\s*(?P<label>[^)\]]+?)\s*[)\]]"
    r"|(?:\s+[-–—|]|[,;])\s*(?:label|type|category|tag)\s*[:=]\s*(?P<bare>[^\"“”()\[\]]+?)\s*$", re.IGNORECASE)
_EXPLANATION = re.compile(r"\s+[-–—]\s+|\s+\(|\s+\[|:\s+|;\s+|\s+because\s+|\s+which\s+|\s+—")
# ** at a word's edge only: "f**k" is a word; __ is never markup here ("__init__")
_BOLD = re.compile(r"(?<!\w)\*\*|\*\*(?!\w)")
_INLINE_MARKER = re.compile(r";|\[\s*span\s*#?\d+\s*\]\s*:|(?<!\w)span\s*#?\d+\s*:", re.IGNORECASE)
_HEADER_WORDS = 9


@dataclass(frozen=True)
class Item:
    """One span the critic named.

    Attributes:
        label: canonical label (one of the labels given to :func:`parse_answer`), a label
            as written (lower case) when it is not one of them, or ``""`` when none was given.
        text: the span as written (quotes, bold and per-item label removed).
        candidates: texts for alignment to try in order, ``text`` first; an unquoted item
            adds shorter readings without a trailing explanation.
        parts: an unquoted item's comma-separated pieces (``great, fun``), for alignment to
            try one by one when no candidate is in the response; empty for one piece.
    """

    label: str
    text: str
    candidates: tuple[str, ...] = ()
    parts: tuple[str, ...] = ()


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
    from_json = _json_items(text or "", labels)
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
    pattern = re.compile(rf"(?<=[\"”’'\w.])[\s;,|]+(?=(?:\*\*)?{_label_regex(labels)}(?:\s+spans?)?(?:\*\*)?\s*:)",
                         re.IGNORECASE)
    cuts = [m for m in pattern.finditer(line) if _outside_quotes(line, m.start())]
    pieces, end = [], len(line)
    for m in reversed(cuts):
        pieces.append(line[m.end():end])
        end = m.start()
    return [line[:end]] + pieces[::-1]


def _outside_quotes(line: str, position: int) -> bool:
    return sum(line[:position].count(q) for q in '"“”«»') % 2 == 0


def _label_regex(labels: tuple[str, ...]) -> str:
    words = ["[\\s_-]+".join(re.escape(word) for word in label.split()) for label in labels]
    return r"\b(?:" + "|".join(sorted(words, key=len, reverse=True)) + r")\b"


def _canonical(written: str, labels: tuple[str, ...]) -> str:
    written = _BOLD.sub("", written).lower().strip(" *_:.")
    normal = re.sub(r"[\s_-]+", " ", written)
    return next((label for label in labels if label == normal), written)


def _strip_markup(text: str) -> str:
    return _BOLD.sub("", text).strip().strip("*_").strip()


def _is_none(text: str) -> bool:
    bare = _strip_markup(text).strip("()[]").strip().rstrip(".!").strip()
    if not bare:
        return bool(text.strip())  # "[]", "()", "**": written, and empty
    bare = bare[1:-1].strip() if len(bare) > 1 and bare[0] in _OPEN_QUOTES and bare[-1] in '"”’\'»`' else bare
    return bool(_NONE.match(bare.rstrip(".!").strip()))


# --- the reader -------------------------------------------------------------------------------

class _Reader:
    """Reads lines one at a time, keeping the current label and whether plain lines are items."""

    def __init__(self, labels: tuple[str, ...], default: str):
        self.labels, self.label = labels, default
        self.header = re.compile(
            rf"^(?P<head>[^\"“”«:\n]{{0,120}}?{_label_regex(labels)}[^\"“”«:\n]{{0,80}}?)"
            r"(?:\s*(?P<sep>[:：]|[-–—](?=\s|$))\s*(?P<rest>.*)|\s*)$", re.IGNORECASE)
        self.items: list[Item] = []
        self.said_none = False
        self.plain_ok = False  # a plain line is an item: under a header whose colon ended the line
        self.block_items = 0  # items since the last header
        self.open: tuple[str, str, bool] | None = None  # (label, text, split on ";") of an item being read
        self.open_quoted = False  # its quote is still open

    def feed(self, raw: str) -> None:
        line = _BOLD.sub("", raw).strip() if raw.strip().startswith("**") else raw.strip()
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
            rest = body[marker.end():]
            inner = _MARKER.match(rest)
            while inner and inner.group("s"):  # "1. Span 1: ..." has two markers
                rest, inner = rest[inner.end():], _MARKER.match(rest[inner.end():])
            if not self._header(rest, heading=False):
                self._start_item(rest, label=self._marker_label(marker))
            return
        if _is_none(body):
            self.said_none = True
            self.block_items += 1  # the block's answer: a later plain line is not its item
        elif self._header(body, heading=heading):
            return
        elif body[:1] in _OPEN_QUOTES:
            self._start_item(body, label=self.label)
        elif self.plain_ok and len(body.split()) <= 40 and not re.match(r"^[A-Z][\w ]{0,24}:\s+\S", body):
            self._start_item(body, label=self.label)
        elif re.match(r"^[^\"“”:]{1,80}:\s*$", body):
            self.plain_ok, self.block_items = True, 0  # a neutral header: "Problematic Spans Identified ...:"
        else:
            self.plain_ok = False  # prose

    def _table_row(self, line: str) -> None:
        """A Markdown table row: a cell naming a label labels the row's first other cell."""
        cells = [_strip_markup(cell) for cell in line.strip().strip("|").split("|")]
        named = [cell for cell in cells if _canonical(cell, self.labels) in self.labels]
        spans = [cell for cell in cells if cell and cell not in named and not set(cell) <= set("-: ")]
        if named and spans and not re.fullmatch(r"(?:span|text|phrase)s?", spans[0], re.IGNORECASE):
            self._start_item(spans[0], label=_canonical(named[0], self.labels))
            self._close()

    def _item_marker(self, marker: re.Match) -> bool:
        bracket = marker.group("b")
        return bracket is None or bool(re.match(r"^(?:[\w-]+\s+){0,3}(?:span|item|phrase)?\s*#?\s*\d+$", bracket, re.I))

    def _marker_label(self, marker: re.Match) -> str:
        named = marker.group("s") or marker.group("b") or ""
        found = re.search(_label_regex(self.labels), named, re.IGNORECASE)
        return _canonical(found.group(), self.labels) if found else self.label

    def _header(self, body: str, *, heading: bool) -> bool:
        """Read ``body`` as a header naming a label (and the items after its colon); return whether it is one."""
        match = self.header.match(_BOLD.sub("", body))
        if not match:
            return False
        head, rest = match.group("head").strip(" *_#>"), (match.group("rest") or "").strip().strip("*_").strip()
        words = len(head.split())
        if words > (_HEADER_WORDS if not rest or rest[:1] in _OPEN_QUOTES else 6):
            return False
        if not match.group("sep") and not heading and words > 3:
            return False
        found = re.search(_label_regex(self.labels), head, re.IGNORECASE)
        self.label = _canonical(found.group(), self.labels)
        self.plain_ok, self.block_items = not rest, 0
        if rest and _is_none(rest):
            self.said_none = True
        elif rest:
            self._start_item(rest, label=self.label, split=True)
        return True

    def _start_item(self, text: str, *, label: str, split: bool = False) -> None:
        text = _BOLD.sub("", text).strip()
        if _is_none(text):
            self.said_none = True
            return
        self.block_items += 1
        self.open = (label, text, split)
        self.open_quoted = text[:1] in _OPEN_QUOTES and not _closed_quotes(text)

    def _continues(self, raw: str, line: str) -> bool:
        """Add ``line`` to the open item when that item wraps onto it; return whether it did."""
        label, text, split = self.open
        if self.open_quoted:
            if not line:
                return False
            self.open = (label, f"{text} {line}", split)
            self.open_quoted = not _closed_quotes(self.open[1])
            return True
        if _ITEM_LABEL.fullmatch(line):  # the item's label on a line of its own
            self.open = (label, f"{text} {line}", split)
            return True
        indented = raw[:1].isspace() and line and not _MARKER.match(line) and line[:1] not in _OPEN_QUOTES
        if indented and text[:1] not in _OPEN_QUOTES and not _is_none(line):
            self.open = (label, f"{text} {line}", split)
            return True
        return False

    def _close(self) -> None:
        if self.open is not None:
            label, text, split = self.open
            self.open, self.open_quoted = None, False
            self.items.extend(_items_of(text, label, self.labels, split_plain=split))


def _closed_quotes(text: str) -> bool:
    close = _OPEN_QUOTES[text[0]]
    return any(ch == close and (close not in "'’" or not text[i + 1:i + 2].isalpha())
               for i, ch in enumerate(text[1:], start=1))


# --- one item ---------------------------------------------------------------------------------

def _items_of(text: str, label: str, labels: tuple[str, ...], *, split_plain: bool) -> list[Item]:
    """The item(s) written in one item's text: quoted spans, or one unquoted span with candidates."""
    text, label = _item_label(text, label, labels)
    if text[:1] == "[" and text.endswith("]") and text[1:2] in _OPEN_QUOTES:  # a JSON-style list of spans
        text = text[1:-1].strip()
    if text[:1] in _OPEN_QUOTES:
        return [Item(label, span, (span,)) for span in _quoted_spans(text) if not _is_none(span)]
    pieces = [p for p in (piece.strip() for piece in _INLINE_MARKER.split(text)) if p] if split_plain else [text]
    items = []
    for piece in pieces:
        piece = piece.strip().strip("*_").strip()
        if piece and not _is_none(piece):
            parts = tuple(p.strip() for p in piece.split(",") if p.strip()) if "," in piece else ()
            items.append(Item(label, piece, _candidates(piece), parts))
    return items


def _item_label(text: str, label: str, labels: tuple[str, ...]) -> tuple[str, str]:
    """Take a per-item label out of the text: ``(Label: X)``, ``[x]``, ``(x)``, ``x: "…"``, ``"…" - x``."""
    written = _ITEM_LABEL.search(text)
    if written:
        name = written.group("label") or written.group("bare")
        return (text[:written.start()] + text[written.end():]).strip(), _canonical(name, labels)
    known = _label_regex(labels)
    for pattern in (rf"[(\[]\s*(?P<l>{known})\s*[)\]]", rf"\s[-–—]\s*(?P<l>{known})\s*$"):
        match = re.search(pattern, text, re.IGNORECASE)
        if match:
            return (text[:match.start()] + text[match.end():]).strip(), _canonical(match.group("l"), labels)
    lead = re.match(rf"^(?P<l>{known})\s*[:：]\s*(?=[\"“”'‘«`])", text, re.IGNORECASE)
    if lead:
        return text[lead.end():], _canonical(lead.group("l"), labels)
    return text, label


def _quoted_spans(text: str) -> list[str]:
    """The quoted spans at the start of ``text``, separated by ``;``, ``,``, ``/``, ``|``, "and", or a
    parenthesised note (``"a" (why), "b"``)."""
    spans, i = [], 0
    while i < len(text) and text[i] in _OPEN_QUOTES:
        close = _OPEN_QUOTES[text[i]]
        j = i + 1
        while j < len(text) and not (text[j] == close and (close not in "'’" or not text[j + 1:j + 2].isalpha())):
            j += 1
        span = _strip_markup(text[i + 1:j])
        if span:
            spans.append(span)
        gap = re.match(r"\s*(?:\([^()]*\))?[\s;,/|]*(?:\band\b|&)?[\s;,/|]*(?:\*\*)?", text[j + 1:])
        i = j + 1 + gap.end()
    return spans


def _candidates(text: str) -> tuple[str, ...]:
    """The text, then the pieces before each explanation separator, longest first."""
    cuts = [text[:m.start()].strip() for m in _EXPLANATION.finditer(text)]
    return tuple(dict.fromkeys([text] + [cut for cut in reversed(cuts) if cut]))


def _json_items(text: str, labels: tuple[str, ...]) -> list[Item] | None:
    """Items of a JSON answer (``{label: [spans]}`` or ``[{"label", "span"|"text"}]``), or None if not JSON."""
    stripped = re.sub(r"^```\w*\s*|\s*```$", "", text.strip())
    if stripped[:1] not in "{[":
        return None
    try:
        data = json.loads(stripped)
    except ValueError:
        return None
    items = []
    if isinstance(data, dict):
        for key, values in data.items():
            values = [values] if isinstance(values, str) else values if isinstance(values, list) else []
            items.extend(Item(_canonical(str(key), labels), str(v), (str(v),)) for v in values
                         if isinstance(v, str) and v.strip() and not _is_none(v))
    elif isinstance(data, list):
        for entry in data:
            if isinstance(entry, dict):
                span = entry.get("span", entry.get("text"))
                if isinstance(span, str) and span.strip():
                    items.append(Item(_canonical(str(entry.get("label", "")), labels), span, (span,)))
    return items
