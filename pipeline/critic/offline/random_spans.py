"""The random-span control: a critic's spans, each moved to a random place in the response.

:func:`random_spans` takes any critic's spans of a response and returns as many spans, each as many
words long (words = the tagger's word tokens), with the same labels, at positions drawn uniformly at
random. Two users: ``critic.placement: random`` moves the spans of whatever critic is configured
(rules, an LLM, a tagger), after its answer is read from the cache
(:func:`pipeline.critic.annotate.placed_rewards`; the ``random`` arm of ``drlc study``); the
``random_spans`` backend of the local server moves the distilled tagger's spans
(:mod:`pipeline.critic.offline.tagger`) before answering. A dense-reward arm with the control gets
the critic arm's reward *amount* (spans x tokens x ``critic.rewards``) on the wrong tokens: it
separates "any dense signal" from "the right tokens".

Why lengths in words, not characters: a character-matched span would cut words ("ck yo"),
which no critic writes and which the aligner then credits to whichever sub-word tokens it
touches; a word-matched span is a run of whole words, as the tagger's is, so the two arms
reward about the same number of policy tokens. Punctuation tokens are neither counted nor
placed on: a lone "." is no span an answer can carry (the parser drops it, and the round
would record a parse_error the tagger never causes); punctuation between two placed words
stays inside the span, as in the tagger's.

Placement: the spans' order is shuffled, then the k blocks of lengths L_1..L_k and the
n - sum(L) free words are arranged uniformly over all their interleavings (stars and bars:
k of the n - sum(L) + k slots are the blocks), so spans never overlap and every word is
equally likely to be covered. The draws come from ``random.Random`` seeded with the SHA-256 of
``seed`` and the response text: the same response always gets the same spans (cache and replay
stay deterministic), and another ``seed`` (the request's ``drlc_seed`` field, set by
``critic.extra_body: {drlc_seed: N}``, so it is in the cache key) gives another control.
"""
from __future__ import annotations

import hashlib
import random
import re

from pipeline.core.errors import CriticError
from pipeline.critic.offline.tagger import tokenize

__all__ = ["random_spans", "span_word_lengths", "words"]

_WORD_CHAR = re.compile(r"\w")


def words(text: str) -> list[tuple[int, int]]:
    """The ``(start, end)`` ranges of the tagger's tokens of ``text`` that hold a word character.

    >>> [("you, f**k off!"[s:e]) for s, e in words("you, f**k off!")]
    ['you', 'f**k', 'off']
    """
    return [(s, e) for s, e in tokenize(text) if _WORD_CHAR.search(text, s, e)]


def span_word_lengths(word_ranges: list[tuple[int, int]], spans: list[tuple[str, int, int]]) -> list[int]:
    """The number of words inside each ``(label, start, end)`` span (at least 1 each).

    >>> span_word_lengths([(0, 3), (5, 9), (10, 13)], [("toxic", 3, 13)])
    [2]
    """
    return [max(1, sum(1 for s, e in word_ranges if s >= start and e <= end)) for _, start, end in spans]


def _rng(text: str, seed: int) -> random.Random:
    digest = hashlib.sha256(f"{int(seed)}\0{text}".encode("utf-8")).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def random_spans(text: str, spans: list[tuple[str, int, int]], *, seed: int = 0) -> list[tuple[str, int, int]]:
    """``spans`` of ``text`` moved to random non-overlapping word positions, in text order.

    :param text: the response
    :param spans: ``(label, start, end)`` character spans of ``text`` (a critic's), not overlapping
    :param seed: with ``text``, the seed of the draws
    :return: one span per input span, same label and word count, at random places
    :raises CriticError: the spans hold more words than the text (they overlap)
    """
    if not spans:
        return []
    tokens = words(text)
    lengths = span_word_lengths(tokens, spans)
    if sum(lengths) > len(tokens):  # overlapping input spans: a tagger's never overlap
        raise CriticError(f"random-span critic: spans of {sum(lengths)} words do not fit in a response of "
                          f"{len(tokens)} words; give it non-overlapping spans")
    rng = _rng(text, seed)
    order = rng.sample(range(len(spans)), len(spans))
    free = len(tokens) - sum(lengths)
    slots = sorted(rng.sample(range(free + len(spans)), len(spans)))
    placed, covered = [], 0
    for j, (slot, i) in enumerate(zip(slots, order)):
        first = slot - j + covered  # free words before this block + the words of the blocks before it
        placed.append((spans[i][0], tokens[first][0], tokens[first + lengths[i] - 1][1]))
        covered += lengths[i]
    return placed
