"""Voting over several critic answers (``critic.samples``, ``critic.vote_min``): a character counts when enough answers mark it.

Each answer contributes the character ranges of its kept spans, per label (every occurrence the
aligner finds). A character is in a voted span of label L when at least ``vote_min`` answers
mark it with L (an answer marking it twice still counts once); voted spans are the maximal runs
of such characters. With one answer and ``vote_min`` 1 the voted spans cover exactly that
answer's characters.

>>> vote_spans([[("toxic", 0, 5)], [("toxic", 3, 8)], []], vote_min=2)
[('toxic', 3, 5)]
"""
from __future__ import annotations

from pipeline.core.errors import ConfigError

__all__ = ["majority", "vote_spans"]


def majority(samples: int) -> int:
    """The smallest count above half of ``samples`` (``critic.vote_min: null``)."""
    return samples // 2 + 1


def vote_spans(marks: list[list[tuple[str, int, int]]], *, vote_min: int) -> list[tuple[str, int, int]]:
    """Voted ``(label, start, end)`` spans (end exclusive), ordered by start then label.

    :param marks: per answer, its located spans ``(label, start, end)``
    :param vote_min: answers that must mark a character
    :raises ConfigError: if ``vote_min`` is not in 1..len(marks)
    """
    if not 1 <= vote_min <= max(len(marks), 1):
        raise ConfigError(f"critic.vote_min {vote_min} must be in 1..{len(marks)} (critic.samples)")
    counts: dict[str, dict[int, int]] = {}
    for answer in marks:
        marked: dict[str, set[int]] = {}
        for label, start, end in answer:
            marked.setdefault(label, set()).update(range(start, end))
        for label, chars in marked.items():
            per_label = counts.setdefault(label, {})
            for ch in chars:
                per_label[ch] = per_label.get(ch, 0) + 1
    voted = []
    for label, per_label in counts.items():
        kept = sorted(ch for ch, n in per_label.items() if n >= vote_min)
        run_start = None
        for i, ch in enumerate(kept):
            if run_start is None:
                run_start = ch
            if i + 1 == len(kept) or kept[i + 1] != ch + 1:
                voted.append((label, run_start, ch + 1))
                run_start = None
    return sorted(voted, key=lambda span: (span[1], span[0]))
