"""One item of a critic answer: its quotes, per-item label, "none" wording and candidate texts.

:mod:`pipeline.critic.parse` finds where the items of an answer are (headers, markers,
lines); this module reads what one item says. Shared pieces of the grammar (the quote
pairs, Markdown bold, the label pattern) live here too, so both modules read them alike.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

__all__ = ["Item", "QUOTES", "BOLD", "ITEM_LABEL", "label_regex", "canonical", "strip_markup", "is_none",
           "closed_quotes", "items_of", "json_items"]

QUOTES = {'"': '"', "“": "”", "”": "”", "„": "“", "«": "»", "'": "'", "‘": "’", "’": "’", "`": "`"}
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
ITEM_LABEL = re.compile(
    r"[(\[]\s*(?:label|type|category|tag)\s*[:=-]\s*(?P<label>[^)\]]+?)\s*[)\]]"
    r"|(?:\s+[-–—|]|[,;])\s*(?:label|type|category|tag)\s*[:=]\s*(?P<bare>[^\"“”()\[\]]+?)\s*$", re.IGNORECASE)
_EXPLANATION = re.compile(r"\s+[-–—]\s+|\s+\(|\s+\[|:\s+|;\s+|\s+because\s+|\s+which\s+|\s+—")
# ** at a word's edge only: "f**k" is a word; __ is never markup here ("__init__")
BOLD = re.compile(r"(?<!\w)\*\*|\*\*(?!\w)")
_INLINE_MARKER = re.compile(r";|\[\s*span\s*#?\d+\s*\]\s*:|(?<!\w)span\s*#?\d+\s*:", re.IGNORECASE)


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


def label_regex(labels: tuple[str, ...]) -> str:
    words = ["[\\s_-]+".join(re.escape(word) for word in label.split()) for label in labels]
    return r"\b(?:" + "|".join(sorted(words, key=len, reverse=True)) + r")\b"


def canonical(written: str, labels: tuple[str, ...]) -> str:
    written = BOLD.sub("", written).lower().strip(" *_:.")
    normal = re.sub(r"[\s_-]+", " ", written)
    return next((label for label in labels if label == normal), written)


def strip_markup(text: str) -> str:
    return BOLD.sub("", text).strip().strip("*_").strip()


def is_none(text: str) -> bool:
    bare = strip_markup(text).strip("()[]").strip().rstrip(".!").strip()
    if not bare:
        return bool(text.strip())  # "[]", "()", "**": written, and empty
    bare = bare[1:-1].strip() if len(bare) > 1 and bare[0] in QUOTES and bare[-1] in '"”’\'»`' else bare
    return bool(_NONE.match(bare.rstrip(".!").strip()))


def closed_quotes(text: str) -> bool:
    close = QUOTES[text[0]]
    return any(ch == close and (close not in "'’" or not text[i + 1:i + 2].isalpha())
               for i, ch in enumerate(text[1:], start=1))


def items_of(text: str, label: str, labels: tuple[str, ...], *, split_plain: bool) -> list[Item]:
    """The item(s) written in one item's text: quoted spans, or one unquoted span with candidates."""
    text, label = _item_label(text, label, labels)
    if text[:1] == "[" and text.endswith("]") and text[1:2] in QUOTES:  # a JSON-style list of spans
        text = text[1:-1].strip()
    if text[:1] in QUOTES:
        return [Item(label, span, (span,)) for span in _quoted_spans(text) if not is_none(span)]
    pieces = [p for p in (piece.strip() for piece in _INLINE_MARKER.split(text)) if p] if split_plain else [text]
    items = []
    for piece in pieces:
        piece = piece.strip().strip("*_").strip()
        if piece and not is_none(piece):
            parts = tuple(p.strip() for p in piece.split(",") if p.strip()) if "," in piece else ()
            items.append(Item(label, piece, _candidates(piece), parts))
    return items


def _item_label(text: str, label: str, labels: tuple[str, ...]) -> tuple[str, str]:
    """Take a per-item label out of the text: ``(Label: X)``, ``[x]``, ``(x)``, ``x: "…"``, ``"…" - x``."""
    written = ITEM_LABEL.search(text)
    if written:
        name = written.group("label") or written.group("bare")
        return (text[:written.start()] + text[written.end():]).strip(), canonical(name, labels)
    known = label_regex(labels)
    trailing = rf"(?:\s[-–—→|]|:)\s*\*?(?P<l>{known})\*?\s*(?:[:;,.]\s.*|[.!]?)$"  # "x - irrelevant: why"
    for pattern in (rf"[(\[]\s*(?P<l>{known})\s*[)\]]", trailing):
        match = re.search(pattern, text, re.IGNORECASE)
        if match:
            return (text[:match.start()] + text[match.end():]).strip(), canonical(match.group("l"), labels)
    lead = re.match(rf"^(?P<l>{known})\s*[:：]\s*(?=[\"“”'‘«`])", text, re.IGNORECASE)
    if lead:
        return text[lead.end():], canonical(lead.group("l"), labels)
    return text, label


def _quoted_spans(text: str) -> list[str]:
    """The quoted spans at the start of ``text``, separated by ``;``, ``,``, ``/``, ``|``, "and", or a
    parenthesised note (``"a" (why), "b"``)."""
    spans, i = [], 0
    while i < len(text) and text[i] in QUOTES:
        close = QUOTES[text[i]]
        j = i + 1
        while j < len(text) and not (text[j] == close and (close not in "'’" or not text[j + 1:j + 2].isalpha())):
            j += 1
        span = strip_markup(text[i + 1:j])
        if span:
            spans.append(span)
        gap = re.match(r"\s*(?:\([^()]*\))?[\s;,/|]*(?:\band\b|&)?[\s;,/|]*(?:\*\*)?", text[j + 1:])
        i = j + 1 + gap.end()
    return spans


def _candidates(text: str) -> tuple[str, ...]:
    """The text, then the pieces before each explanation separator, longest first."""
    cuts = [text[:m.start()].strip() for m in _EXPLANATION.finditer(text)]
    return tuple(dict.fromkeys([text] + [cut for cut in reversed(cuts) if cut]))


def json_items(text: str, labels: tuple[str, ...]) -> list[Item] | None:
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
            items.extend(Item(canonical(str(key), labels), str(v), (str(v),)) for v in values
                         if isinstance(v, str) and v.strip() and not is_none(v))
    elif isinstance(data, list):
        for entry in data:
            if isinstance(entry, dict):
                span = entry.get("span", entry.get("text"))
                if isinstance(span, str) and span.strip():
                    items.append(Item(canonical(str(entry.get("label", "")), labels), span, (span,)))
    return items
