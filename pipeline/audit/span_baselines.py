"""Trivial span predictors that put a critic's audit scores in context.

- ``everything``: the whole post is one span of each label (SemEval's "all toxic").
- ``nothing``: no span at all (every post with gold spans scores 0, every post without 1).
- ``wordlist``: a word list learnt from a labelled train split. A word occurrence counts as
  labelled L when more than half of its characters are gold-labelled L; a word (lower-cased)
  joins L's list when it occurs at least ``min_count`` times in the train split and more
  than ``min_share`` of its occurrences are labelled L. Applied to a post, every occurrence
  of a listed word is a predicted span of its label.

Words are runs of letters, digits and underscores, with inner apostrophes ("don't").
"""
from __future__ import annotations

import re
from collections import Counter

from pipeline.audit.labelled import LabelledPost
from pipeline.audit.span_metrics import characters
from pipeline.core.errors import ConfigError

__all__ = ["BASELINES", "everything", "nothing", "learn_wordlist", "wordlist_spans"]

BASELINES = ("everything", "nothing", "wordlist")
_WORD = re.compile(r"\w+(?:['’]\w+)*")


def everything(post: LabelledPost, labels: tuple[str, ...]) -> list[tuple[str, int, int]]:
    """The whole text as one span per label (none for an empty text)."""
    return [(label, 0, len(post.text)) for label in labels] if post.text else []


def nothing(post: LabelledPost, labels: tuple[str, ...]) -> list[tuple[str, int, int]]:
    """No span."""
    return []


def learn_wordlist(posts: list[LabelledPost], *, min_count: int = 5, min_share: float = 0.5) -> dict[str, str]:
    """Learn word -> label from labelled posts (see the module doc); ties go to no label.

    >>> post = LabelledPost(line=1, post_id="1", text="you idiot", spans=(("toxic", 4, 9),))
    >>> learn_wordlist([post], min_count=2), learn_wordlist([post, post], min_count=2)
    ({}, {'idiot': 'toxic'})

    :raises ConfigError: min_count < 1 or min_share outside [0.5, 1)
    """
    if min_count < 1 or not 0.5 <= min_share < 1:
        raise ConfigError(f"word list min_count={min_count}, min_share={min_share}: need min_count >= 1 and "
                          "0.5 <= min_share < 1 (so a word gets at most one label)")
    seen: Counter[str] = Counter()
    labelled: Counter[tuple[str, str]] = Counter()
    for post in posts:
        gold = characters(post.spans)
        labels = {label for label, _, _ in post.spans}
        for match in _WORD.finditer(post.text):
            word = match.group().lower()
            seen[word] += 1
            for label in labels:
                covered = sum((label, i) in gold for i in range(match.start(), match.end()))
                if covered * 2 > match.end() - match.start():
                    labelled[word, label] += 1
    chosen: dict[str, str] = {}
    for (word, label), count in sorted(labelled.items()):
        if seen[word] >= min_count and count > min_share * seen[word]:
            chosen[word] = label
    return chosen


def wordlist_spans(post: LabelledPost, wordlist: dict[str, str]) -> list[tuple[str, int, int]]:
    """Every occurrence of a listed word in the post, as a span of the word's label."""
    return [(wordlist[m.group().lower()], m.start(), m.end())
            for m in _WORD.finditer(post.text) if m.group().lower() in wordlist]
