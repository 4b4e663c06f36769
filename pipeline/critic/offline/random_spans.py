"""The random-span control critic: the tagger's spans, each moved to a random place in the response.

It answers with as many spans as the distilled tagger (:mod:`pipeline.critic.offline.tagger`)
finds in a response, each as long as the tagger's span in the tagger's own tokens (words and
single punctuation marks), with the same label, but at positions drawn uniformly at random. A
dense-reward arm with this critic gets the tagger arm's reward *amount* (spans x tokens x
``critic.rewards``) on the wrong tokens: it separates "any dense signal" from "the right tokens".

Why lengths in tokens, not characters: a character-matched span would cut words ("ck yo"),
which no critic writes and which the aligner then credits to whichever sub-word tokens it
touches; a token-matched span is a run of whole words, as the tagger's is, so the two arms
reward about the same number of policy tokens.

Placement: the spans' order is shuffled, then the k blocks of lengths L_1..L_k and the
n - sum(L) free tokens are arranged uniformly over all their interleavings (stars and bars:
k of the n - sum(L) + k slots are the blocks), so spans never overlap and every token is
equally likely to be covered. The draws come from ``random.Random`` seeded with the SHA-256 of
``seed`` and the response text: the same response always gets the same spans (cache and replay
stay deterministic), and another ``seed`` (the request's ``drlc_seed`` field, set by
``critic.extra_body: {drlc_seed: N}``, so it is in the cache key) gives another control.
"""
from __future__ import annotations

import hashlib
import random

from pipeline.core.errors import CriticError
from pipeline.critic.offline.tagger import tokenize

__all__ = ["random_spans", "span_token_lengths"]


def span_token_lengths(tokens: list[tuple[int, int]], spans: list[tuple[str, int, int]]) -> list[int]:
    """The number of ``tokens`` inside each ``(label, start, end)`` span (at least 1 each).

    >>> span_token_lengths([(0, 3), (4, 8), (9, 12)], [("toxic", 4, 12)])
    [2]
    """
    return [max(1, sum(1 for s, e in tokens if s >= start and e <= end)) for _, start, end in spans]


def _rng(text: str, seed: int) -> random.Random:
    digest = hashlib.sha256(f"{int(seed)}\0{text}".encode("utf-8")).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def random_spans(text: str, spans: list[tuple[str, int, int]], *, seed: int = 0) -> list[tuple[str, int, int]]:
    """``spans`` of ``text`` moved to random non-overlapping token positions, in text order.

    :param text: the response
    :param spans: ``(label, start, end)`` character spans of ``text`` (the tagger's), not overlapping
    :param seed: with ``text``, the seed of the draws
    :return: one span per input span, same label and token count, at random places
    :raises CriticError: the spans hold more tokens than the text (they overlap)
    """
    if not spans:
        return []
    tokens = tokenize(text)
    lengths = span_token_lengths(tokens, spans)
    if sum(lengths) > len(tokens):  # overlapping input spans: a tagger's never overlap
        raise CriticError(f"random-span critic: spans of {sum(lengths)} tokens do not fit in a response of "
                          f"{len(tokens)} tokens; give it non-overlapping spans")
    rng = _rng(text, seed)
    order = rng.sample(range(len(spans)), len(spans))
    free = len(tokens) - sum(lengths)
    slots = sorted(rng.sample(range(free + len(spans)), len(spans)))
    placed, covered = [], 0
    for j, (slot, i) in enumerate(zip(slots, order)):
        first = slot - j + covered  # free tokens before this block + the tokens of the blocks before it
        placed.append((spans[i][0], tokens[first][0], tokens[first + lengths[i] - 1][1]))
        covered += lengths[i]
    return placed
