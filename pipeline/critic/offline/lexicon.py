"""The offline lexicon critic: answers a rendered critic prompt without any model.

It is the ``lexicon`` backend of the local OpenAI-compatible server, so the demo profile
runs the production client path with no network. It reads the same messages an LLM reads
(the ``Task: <task>`` line of the system message and the ``<response>`` / ``<document>`` /
``<summary>`` blocks of the last user message) and answers in the templates' output
format, written by :func:`pipeline.critic.parse.format_answer` (``layout="drlc"``).
Other layouts (``LAYOUTS``) let tests run the tolerant parser through the real
HTTP path: ``paper`` (the RELC prompts' headers and ``[Span N]:`` / ``Toxic Span N:`` /
``Span N: ... (Label: X)`` items), ``markdown`` (bold headers, bullets, curly quotes) and
``messy`` (a preamble, CRLF, varied header wording and case, numbering, quote styles,
bold, explanations after items, wrapped lines, "N/A"-style nones), chosen per answer from
a hash of the response so a replay writes the same text. Every layout names the same
spans, copied exactly, so the spans kept after parsing do not depend on the layout.

- sentiment: words and two-word entries of the VADER lexicon. A preceding chain of VADER
  intensifiers ("very", "really", ...) is kept in the span; a negation just before that
  chain (VADER's negation words, "no", anything ending in "n't", optionally followed by
  "a"/"an"/"the") flips the sign and is kept too: "not good" is negative, "very bad"
  is one span. Negation words are never spans by themselves; emoticons are ignored.
- toxicity: the terms of the offline toxicity reward's lexicon (pipeline/data/toxicity_lexicon.py
  TOXIC_TERMS), as whole words, so the critic names exactly what the lexicon reward counts.
- summarization (provisional): maximal runs of summary content words that never occur in
  the document, all labelled "irrelevant"; "incoherent" and "factually incorrect" are
  never produced. This is a placeholder, not a faithfulness judge.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache

from pipeline.core.errors import CriticError
from pipeline.critic.parse import format_answer
from pipeline.critic.structured import requested_span_limit, spans_json
from pipeline.data.toxicity_lexicon import TOXIC_TERMS

__all__ = ["ANSWER_LABELS", "LAYOUTS", "TOXIC_WORDS", "answer", "complete", "spans_of"]

LAYOUTS = ("drlc", "paper", "markdown", "messy")
# the labels the shipped prompts/*.md templates ask for, in their order: what this critic writes
ANSWER_LABELS = {"sentiment": ("positive", "negative"), "toxicity": ("toxic",),
                 "summarization": ("irrelevant", "incoherent", "factually incorrect")}

_TASK_LINE = re.compile(r"^Task:[ \t]*(\S+)[ \t]*$", re.MULTILINE)
_WORD = re.compile(r"\w+(?:['’]\w+)*")
_DETERMINERS = frozenset({"a", "an", "the"})
TOXIC_WORDS = frozenset(TOXIC_TERMS)  # exactly the terms the offline toxicity reward counts
_STOPWORDS = frozenset(
    "a an the and or but of to in on at for with by from as is are was were be been being it its this that "
    "these those he she they we you i his her their our your my me him them us not no so than then there "
    "has have had do does did will would can could should may might also into over after before about".split()
)


def answer(messages: list[dict], layout: str = "drlc") -> str:
    """Answer a rendered critic prompt in the template's output format (or another layout).

    Params:
        messages: OpenAI chat messages as rendered by ``Template.render``.
        layout: one of ``LAYOUTS``.
    Returns:
        The answer text, e.g. ``'Positive: "very good"\\nNegative: "not funny"'``.
    Raises:
        CriticError: no ``Task:`` line in a system message, an unknown task, the
            delimited text block missing from the last user message, or an unknown format.
    """
    if layout not in LAYOUTS:
        raise CriticError(f"lexicon critic: unknown layout {layout!r}; valid: {list(LAYOUTS)}")
    task, spans = spans_of(messages)
    user = _last_user_text(messages)
    if layout == "drlc":
        return format_answer(ANSWER_LABELS[task], spans)
    from pipeline.critic.offline.layouts import write_layout

    seed = int(hashlib.sha256(user.encode("utf-8")).hexdigest()[:8], 16)
    return write_layout(layout, task=task, labels=ANSWER_LABELS[task], spans=spans, seed=seed)


def spans_of(messages: list[dict]) -> tuple[str, list[tuple[str, str]]]:
    """(task, ``(label, text)`` spans) the lexicon critic finds for a rendered prompt."""
    task = _task_of(messages)
    user = _last_user_text(messages)
    if task == "sentiment":
        return task, sentiment_spans(_delimited(user, "response"))
    if task == "toxicity":
        return task, _toxic_spans(_delimited(user, "response"))
    return task, _unsupported_spans(_delimited(user, "summary"), _delimited(user, "document"))


def complete(request: dict, layout: str = "drlc") -> str:
    """Answer a chat-completions body: drlc's span JSON when it asks for a structured answer
    (``critic.answer_format`` json: a ``json_schema`` ``response_format``; copy: ``drlc_copy``), else :func:`answer`.

    The lexicon's spans are copied from the response already, so a ``copy`` answer needs no constraint;
    at most the request's ``max_spans`` (or the schema's ``maxItems``) are written.
    """
    limit = requested_span_limit(request)
    if limit is None:
        return answer(request["messages"], layout=layout)
    return spans_json(spans_of(request["messages"])[1], limit)


def _task_of(messages: list[dict]) -> str:
    for message in messages:
        if message.get("role") == "system":
            match = _TASK_LINE.search(str(message.get("content", "")))
            if match:
                task = match.group(1)
                if task not in ANSWER_LABELS:
                    raise CriticError(f"lexicon critic: unknown task {task!r}; it answers {sorted(ANSWER_LABELS)}")
                return task
    raise CriticError("lexicon critic: no 'Task: <task>' line in a system message; render the prompt from prompts/")


def _last_user_text(messages: list[dict]) -> str:
    users = [m for m in messages if m.get("role") == "user"]
    if not users or not isinstance(users[-1].get("content"), str):
        raise CriticError("lexicon critic: no user message with text content; render the prompt from prompts/")
    return users[-1]["content"]


def _delimited(text: str, tag: str) -> str:
    """Return the text between the first ``<tag>`` and the last ``</tag>``, minus one newline each side."""
    opening, closing = f"<{tag}>", f"</{tag}>"
    start, end = text.find(opening), text.rfind(closing)
    if start < 0 or end < start + len(opening):
        raise CriticError(f"lexicon critic: the user message has no {opening}...{closing} block")
    inner = text[start + len(opening) : end]
    inner = inner[1:] if inner.startswith("\n") else inner
    return inner[:-1] if inner.endswith("\n") else inner


@lru_cache(maxsize=1)
def _vader():
    from vaderSentiment.vaderSentiment import BOOSTER_DICT, NEGATE, SentimentIntensityAnalyzer

    # VADER counts "despite" as a negation; it does not flip the word after it
    negations = (frozenset(NEGATE) | {"no"}) - {"despite"}
    return SentimentIntensityAnalyzer().lexicon, frozenset(BOOSTER_DICT), negations


def _is_negation(word: str, negations: frozenset) -> bool:
    return word in negations or word.replace("’", "'").endswith("n't")


def sentiment_spans(text: str) -> list[tuple[str, str]]:
    lexicon, boosters, negations = _vader()
    words = [(m.start(), m.end(), m.group().lower()) for m in _WORD.finditer(text)]

    def joined(i: int) -> bool:  # words i and i+1 are separated by whitespace only
        return i + 1 < len(words) and text[words[i][1] : words[i + 1][0]].isspace()

    spans: list[tuple[str, str]] = []
    k = 0
    while k < len(words):
        pair = f"{words[k][2]} {words[k + 1][2]}" if joined(k) else ""
        last = k + 1 if pair in lexicon else k
        valence = lexicon[pair] if pair in lexicon else lexicon.get(words[k][2], 0.0)
        modifier = _is_negation(words[k][2], negations) or words[k][2] in boosters
        if not valence or (modifier and last == k):
            k += 1
            continue
        first = k
        while first > 0 and joined(first - 1) and words[first - 1][2] in boosters:
            first -= 1
        probe = first
        while probe > 0 and joined(probe - 1) and words[probe - 1][2] in _DETERMINERS:
            probe -= 1
        if probe > 0 and joined(probe - 1) and _is_negation(words[probe - 1][2], negations):
            first, valence = probe - 1, -valence
        label = "positive" if valence > 0 else "negative"
        spans.append((label, text[words[first][0] : words[last][1]]))
        k = last + 1
    return list(dict.fromkeys(spans))


def _toxic_spans(text: str) -> list[tuple[str, str]]:
    spans = []
    for phrase in sorted(TOXIC_WORDS, key=len, reverse=True):
        pattern = r"(?<!\w)" + r"\s+".join(map(re.escape, phrase.split())) + r"(?!\w)"
        for match in re.finditer(pattern, text, re.IGNORECASE):
            spans.append((match.start(), ("toxic", match.group())))
    return list(dict.fromkeys(span for _, span in sorted(spans)))


def _unsupported_spans(summary: str, document: str) -> list[tuple[str, str]]:
    supported = {word.lower() for word in _WORD.findall(document)} | _STOPWORDS
    words = list(_WORD.finditer(summary))
    spans, run = [], []
    for match in words + [None]:
        unsupported = match is not None and match.group().lower() not in supported
        contiguous = match is not None and run and not summary[run[-1].end() : match.start()].strip()
        if unsupported and (not run or contiguous):
            run.append(match)
            continue
        if run:
            spans.append(("irrelevant", summary[run[0].start() : run[-1].end()]))
        run = [match] if unsupported else []
    return list(dict.fromkeys(spans))
