"""Critic answers written in the layouts real LLMs use, for testing the tolerant parser end to end.

:func:`write_layout` writes the same labelled spans as drlc's own format
(:func:`pipeline.critic.parse.format_answer`) in another layout:

- ``paper``: the RELC prompts' answer layout: ``Identified Positive Text Span:`` headers with
  ``[Span N]: text`` items (sentiment), ``Toxic Span N: text`` (toxicity), ``Span N: text
  (Label: Irrelevant)`` (summarization), ``None identified`` for nothing.
- ``markdown``: ``**Positive spans:**`` headers, ``-`` bullets, curly quotes.
- ``messy``: one of several chat-model habits per answer, drawn from ``seed``: a preamble,
  CRLF line ends, header wording and case, numbered or bracketed items, any quote style,
  bold inside quotes, an explanation after an item, an item wrapped onto the next line,
  "N/A" or "(none)" for nothing, a closing remark.

Span texts are written exactly as given, so every layout aligns to the same characters.
The lexicon critic (``drlc critic serve --layout``) is its only production caller.
"""

from __future__ import annotations

import random

__all__ = ["write_layout"]

_QUOTES = [('"', '"'), ("“", "”"), ("«", "»"), ("`", "`"), ('"**', '**"')]
_NONES = ["None identified", "none", "N/A", "(none)", "Nothing found.", "None."]
_PREAMBLES = ["", "Sure! Here is my analysis.\n\n", "Here are the spans I found:\n", "Analysis:\n\n"]
_CLOSINGS = ["", "\n\nLet me know if you need anything else.", "\n\nNote: spans are copied from the text."]


def write_layout(layout: str, *, task: str, labels: tuple[str, ...], spans, seed: int = 0) -> str:
    """Write ``(label, text)`` spans in ``layout`` (``paper``, ``markdown`` or ``messy``).

    :param layout: the layout name
    :param task: the task, which picks the paper's headers and item markers
    :param labels: the task's labels, in the order their blocks are written
    :param spans: ``(label, text)`` pairs, every label in ``labels``
    :param seed: picks the habits of a ``messy`` answer
    :return: the answer text
    :raises ValueError: on an unknown layout
    """
    by_label = {label: [text for lab, text in spans if lab == label] for label in labels}
    if layout == "paper":
        return _paper(task, labels, by_label)
    if layout == "markdown":
        return "\n\n".join(f"**{label.capitalize()} spans:**\n" + (
            "\n".join(f"- “{text}”" for text in by_label[label]) or "- None identified") for label in labels)
    if layout == "messy":
        return _messy(task, labels, by_label, random.Random(seed))
    raise ValueError(f"unknown answer layout {layout!r}; valid: ['paper', 'markdown', 'messy']")


def _paper(task: str, labels, by_label) -> str:
    if task == "summarization":
        items = [f"Span {i}: {text} (Label: {label.title()})"
                 for i, (label, text) in enumerate(((lab, t) for lab in labels for t in by_label[lab]), start=1)]
        return "Problematic Spans Identified in the Summary:\n" + ("\n".join(items) or "None identified")
    blocks = []
    for label in labels:
        if task == "toxicity":
            header, marker = "Toxic Spans Identified in the Sentence:", "Toxic Span {}:"
        else:
            header, marker = f"Identified {label.capitalize()} Text Span:", "[Span {}]:"
        items = [f"{marker.format(i)} {text}" for i, text in enumerate(by_label[label], start=1)]
        blocks.append(header + "\n" + ("\n".join(items) or "None identified"))
    return "\n\n".join(blocks)


def _messy(task: str, labels, by_label, rng: random.Random) -> str:
    header = rng.choice(["{L}:", "**{L} spans:**", "{l} spans -", "### {L}", "Identified {L} Text Span:",
                         "{U}:"])
    marker = rng.choice(["- ", "* ", "• ", "{n}. ", "{n}) ", "[Span {n}]: ", "Span {n}: "])
    opening, closing = rng.choice(_QUOTES)
    inline = rng.random() < 0.3 and not header.startswith("#")  # a Markdown heading stands on its own line
    after = "\n" if header.startswith("#") else " "
    explain = rng.random() < 0.4
    wrap = rng.random() < 0.3
    blocks = []
    for label in labels:
        head = header.format(L=label.capitalize(), l=label, U=label.upper())
        texts = by_label[label]
        if not texts:
            blocks.append(f"{head}{after}{rng.choice(_NONES)}")
            continue
        quoted = [f"{opening}{text}{closing}" for text in texts]
        if inline:
            blocks.append(f"{head} " + "; ".join(quoted))
            continue
        lines = []
        for n, item in enumerate(quoted, start=1):
            words = item.split(" ")
            if wrap and len(words) > 2:
                item = " ".join(words[:2]) + "\n   " + " ".join(words[2:])
            suffix = f" - this reads as {label}" if explain else ""
            lines.append(marker.format(n=n) + item + suffix)
        blocks.append(head + "\n" + "\n".join(lines))
    text = rng.choice(_PREAMBLES) + "\n\n".join(blocks) + rng.choice(_CLOSINGS)
    return text.replace("\n", "\r\n") if rng.random() < 0.3 else text
