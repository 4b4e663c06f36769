"""Constrained decoding of structured critic answers in drlc's ``hf`` backend: a character automaton and a logits processor.

:class:`SpanAutomaton` accepts exactly the answers of :mod:`pipeline.critic.grammar`'s
layout, ``{"spans": [{"label": "<label>", "text": "<span>"}, ...]}`` with at most
``max_spans`` spans, where ``<span>`` is

- with a ``source`` (``critic.answer_format: copy``): a non-empty substring of the source as
  JSON-escaped, cut at character boundaries, with a non-space character (the GBNF grammar's
  language less whitespace-only spans); its state is the set of positions in the escaped source
  where the span written so far could end; with ``words`` (``copy_words``) the substring starts
  and ends at word edges (:func:`pipeline.critic.grammar.span_bounds`; the grammar's language);
- without one (``json``): any JSON string with a non-space character and no escapes or control
  characters (in closing mode, below, any string).

:class:`SpanConstraint` runs the automaton inside ``generate``: before each token, the
tokens allowed next are found by walking a trie of the vocabulary's token strings from the
current state (a branch is cut at its first refused character), and every other logit is
set to ``-inf``. The end-of-sequence token is allowed only once the object is closed.
Greedy decoding stays deterministic, and a row's mask depends on its own tokens only, so a
constrained answer is the same alone as in a batch. Tokens whose text is not whole UTF-8
(byte pieces of a multi-byte character) or special are never allowed, and a constrained
answer's text is the concatenation of its tokens' texts, so it is exactly what the
automaton accepted.

Why not a library: xgrammar, outlines and lm-format-enforcer all compile a grammar (or
schema) per request; for ``copy`` that grammar is new for every response (one rule per
character), and none of them is installed or pinned here; this automaton is ~150 lines and
needs no compile step.
"""

from __future__ import annotations

import json
import re

from pipeline.core.errors import CriticError
from pipeline.critic.grammar import CLOSE, ITEM_CLOSE, ITEM_MID, ITEM_OPEN, OPEN, SEPARATOR, json_units, span_bounds

__all__ = ["CLOSING_TOKENS", "SpanAutomaton", "SpanConstraint", "TokenTrie"]

CLOSING_TOKENS = 24
"""Tokens before its limit at which a constrained answer starts closing its JSON (a new span costs ~15)."""


class SpanAutomaton:
    """Character automaton of a structured answer; states are hashable tuples, ``None`` is refusal.

    :param labels: the span labels
    :param max_spans: most spans
    :param source: the text spans are copied from, or None for free span texts
    :param max_span_bytes: most UTF-8 bytes of a copied span's JSON-escaped text, or most characters of
        a free one (the answer bound, :func:`pipeline.critic.structured.answer_bound`); None: any length
    """

    def __init__(self, labels, max_spans: int, source: str | None = None, words: bool = False,
                 max_span_bytes: int | None = None) -> None:
        if not labels or max_spans < 1:
            raise CriticError(f"a span constraint needs labels and max_spans >= 1, got {labels!r} and {max_spans}")
        self.labels, self.max_spans, self.source = tuple(str(x) for x in labels), max_spans, source
        self.words, self.max_span_bytes = words, max_span_bytes
        if source is not None:
            units = json_units(source)
            self.escaped = "".join(units)
            offsets = [0]
            for unit in units:
                offsets.append(offsets[-1] + len(unit))
            starts, ends = span_bounds(source, words)
            self.starts = frozenset(offsets[i] for i in starts)
            self.ends = frozenset(offsets[i] for i in ends)  # where a span may end, in the escaped source
            self.last_end = max(self.ends, default=0)  # no span reaches past it
            self.positions: dict[str, set[int]] = {}
            for j, ch in enumerate(self.escaped):
                self.positions.setdefault(ch, set()).add(j)
            self.boundaries = frozenset(offsets)
            self.to_end = _bytes_to_end(self.escaped, self.ends)
            blank = [not unit.strip() or unit in ("\\n", "\\t", "\\r") for unit in units for _ in unit]
            self.to_text = _bytes_to_text(self.escaped, blank, self.to_end)
            if max_span_bytes is not None:  # a start from which no span with text fits the bound is none
                self.starts = frozenset(j for j in self.starts if self.to_text[j] <= max_span_bytes)

    @property
    def start(self) -> tuple:
        return ("lit", ((OPEN, "first"),), 0, 0)

    def _after(self, tag: str, spans: int) -> tuple:
        """The state entered when a literal option tagged ``tag`` is complete."""
        if tag == "done":
            return ("done",)
        if tag == "first":
            can_copy = self.source is None or bool(self.starts)
            options = ((CLOSE, "done"),) + (((ITEM_OPEN, "label"),) if can_copy else ())
            return ("lit", options, 0, spans)
        if tag == "label":
            return ("lit", tuple((label + ITEM_MID, "text") for label in self.labels), 0, spans)
        if tag == "text":
            return ("free", spans, "") if self.source is None else ("copy", self.starts, "", spans)
        options = ((CLOSE, "done"),) + (((SEPARATOR + ITEM_OPEN, "label"),) if spans < self.max_spans else ())
        return ("lit", options, 0, spans)  # tag "after": a span was closed

    def step(self, state: tuple, ch: str, closing: bool = False) -> tuple | None:
        """The state after ``ch``, or None if ``ch`` is not allowed.

        ``closing``: the token budget is nearly spent, so only the shortest way to a closed
        object is allowed: no new span, and a span text that could end here must end.
        """
        kind = state[0]
        if kind == "lit":
            _, options, pos, spans = state
            if closing and pos == 0 and any(tag == "done" for _, tag in options):
                options = tuple(option for option in options if option[1] == "done")
            kept = tuple(option for option in options if option[0][pos] == ch)
            if not kept:
                return None
            done = [option for option in kept if len(option[0]) == pos + 1]
            return self._after(done[0][1], spans) if done else ("lit", kept, pos + 1, spans)
        if kind == "free":
            _, spans, typed = state
            if ch == '"' and (typed.strip() or closing):
                return ("lit", ((ITEM_CLOSE, "after"),), 1, spans + 1)
            if closing or ch in '"\\' or ord(ch) < 0x20 or self._too_long(len(typed) + 1):
                return None
            return ("free", spans, typed + ch)
        if kind == "copy":
            _, ends, typed, spans = state
            may_end = ends <= self.boundaries and bool(ends & self.ends) and _has_text(typed)
            if may_end and (ch == '"' or closing):
                return ("lit", ((ITEM_CLOSE, "after"),), 1, spans + 1) if ch == '"' else None
            moved = frozenset(j + 1 for j in ends & self.positions.get(ch, set()) if j < self.last_end)
            if self.max_span_bytes is not None:  # keep the positions from which an end is within the bound
                size, rest = len((typed + ch).encode()), self.to_end if _typed_text(typed + ch) else self.to_text
                moved = frozenset(j for j in moved if size + rest[j] <= self.max_span_bytes)
            return ("copy", moved, typed + ch, spans) if moved else None
        return None  # "done": only the end of the sequence

    def _too_long(self, size: int) -> bool:
        """Whether a span text of ``size`` (bytes copied, characters free) passes the bound."""
        return self.max_span_bytes is not None and size > self.max_span_bytes

    @staticmethod
    def is_done(state: tuple) -> bool:
        return state[0] == "done"


def _bytes_to_end(escaped: str, ends: frozenset) -> list[float]:
    """Per offset of ``escaped`` (and its end), the UTF-8 bytes to the nearest span end at or after it (inf: none).

    >>> _bytes_to_end("ab c", frozenset({2, 4}))
    [2, 1, 0, 1, 0]
    """
    out, nearest = [float("inf")] * (len(escaped) + 1), None
    for j in range(len(escaped), -1, -1):
        if j in ends:
            nearest, cost = j, 0
        elif nearest is not None:
            cost += len(escaped[j].encode())
        out[j] = cost if nearest is not None else float("inf")
    return out


def _bytes_to_text(escaped: str, blank: list[bool], to_end: list[float]) -> list[float]:
    """Per offset of ``escaped``, the UTF-8 bytes to the nearest span end with a non-blank character on the way.

    >>> _bytes_to_text(" ab", [True, False, False], _bytes_to_end(" ab", frozenset({1, 2, 3})))
    [2, 1, 1, inf]
    """
    out = [float("inf")] * (len(escaped) + 1)
    for j in range(len(escaped) - 1, -1, -1):
        out[j] = len(escaped[j].encode()) + (to_end[j + 1] if not blank[j] else out[j + 1])
    return out


def _typed_text(escaped: str) -> bool:
    """Whether a JSON-escaped span prefix (maybe cut inside an escape) already holds a non-blank character."""
    return bool(re.sub(r"\\[ntr]|\\$", "", escaped).strip())


def _has_text(escaped: str) -> bool:
    """Whether a JSON-escaped span text, cut at a character boundary, holds a non-space character."""
    return bool(escaped) and bool(json.loads(f'"{escaped}"').strip())


class TokenTrie:
    """The vocabulary's token texts as a character trie: node = {char: child, None: [token ids]}.

    :param pieces: token id -> its text, or None for a token never allowed (special, not whole UTF-8)
    """

    def __init__(self, pieces: list[str | None]) -> None:
        self.pieces = pieces
        self.root: dict = {}
        for token_id, piece in enumerate(pieces):
            if not piece:
                continue
            node = self.root
            for ch in piece:
                node = node.setdefault(ch, {})
            node.setdefault(None, []).append(token_id)

    @classmethod
    def of(cls, tokenizer) -> TokenTrie:
        special = set(tokenizer.all_special_ids)
        pieces = []
        for token_id in range(len(tokenizer)):
            piece = None if token_id in special else tokenizer.decode([token_id])
            pieces.append(None if not piece or "\ufffd" in piece else piece)
        return cls(pieces)

    def allowed(self, automaton: SpanAutomaton, state: tuple, closing: bool = False) -> list[int]:
        """Ids of the tokens whose whole text the automaton accepts from ``state`` (see ``step``'s ``closing``)."""
        out, stack = [], [(self.root, state)]
        while stack:
            node, current = stack.pop()
            for ch, child in node.items():
                if ch is None:
                    continue
                after = automaton.step(current, ch, closing)
                if after is None:
                    continue
                out.extend(child.get(None, ()))
                stack.append((child, after))
        return out


class SpanConstraint:
    """A ``generate`` logits processor: each constrained row may only continue its automaton.

    :param automata: per batch row, a :class:`SpanAutomaton` or None (unconstrained)
    :param trie: the tokenizer's :class:`TokenTrie`
    :param prompt_width: columns of (left-padded) prompt before the first new token
    :param eos_id: the end-of-sequence token, allowed once a row's object is closed
    :param limits: per row, its token limit; within :data:`CLOSING_TOKENS` of it the row may only
        close its object (``SpanAutomaton.step``'s ``closing``), so an answer is rarely cut off
    """

    def __init__(self, automata: list[SpanAutomaton | None], trie: TokenTrie, *, prompt_width: int,
                 eos_id: int | None, limits: list[int] | None = None) -> None:
        self.automata, self.trie, self.width, self.eos_id = automata, trie, prompt_width, eos_id
        self.limits = limits or [None] * len(automata)
        self.states = [a.start if a is not None else None for a in automata]
        self.fed = [0] * len(automata)
        self.ended = [False] * len(automata)

    def __call__(self, input_ids, scores):
        import torch

        for row, automaton in enumerate(self.automata):
            if automaton is None or self.ended[row]:
                continue
            new = input_ids[row, self.width + self.fed[row]:].tolist()
            for token_id in new:
                if token_id == self.eos_id:
                    self.ended[row] = True
                    break
                closing = self._closing(row)  # the mode the token was chosen in
                for ch in self.trie.pieces[token_id] or "":
                    self.states[row] = automaton.step(self.states[row], ch, closing) if self.states[row] else None
                self.fed[row] += 1
            if self.states[row] is None:  # only a forced end token can refuse: nothing more to steer
                self.ended[row] = True
            if self.ended[row]:
                continue
            state = self.states[row]
            allowed = [self.eos_id] if automaton.is_done(state) and self.eos_id is not None \
                else self.trie.allowed(automaton, state, self._closing(row))
            if not allowed and self.eos_id is not None:  # a dead end (no token spells the next character): stop
                allowed = [self.eos_id]
            mask = torch.full_like(scores[row], float("-inf"))
            mask[torch.tensor(allowed, dtype=torch.long, device=scores.device)] = 0.0
            scores[row] = scores[row] + mask
        return scores


    def _closing(self, row: int) -> bool:
        limit = self.limits[row]
        return limit is not None and limit - self.fed[row] <= CLOSING_TOKENS


