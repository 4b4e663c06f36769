"""How well predicted spans match human-labelled spans: character F1 and span precision/recall.

A span is ``(label, start, end)``: character offsets into the post, end exclusive.

- **Character F1** is the official metric of SemEval-2021 Task 5 (Toxic Spans Detection),
  computed per post and then averaged over posts: with P the set of predicted characters
  and G the gold ones, ``F1 = 2|P ∩ G| / (|P| + |G|)``; a post with no gold and no
  predicted characters scores 1, a post where exactly one side is empty scores 0. drlc
  counts a character as a ``(label, offset)`` pair, so with several labels (sentiment's
  positive/negative) a character only counts when its label agrees too; with one label
  (toxicity) this is exactly the official metric.
- **Span precision and recall** (micro, over all spans of all posts): a predicted span
  *matches* a gold span of the same label when their intersection over union (IoU) of
  characters is at least ``iou`` (default 0.5). Precision = matched predicted spans /
  predicted spans; recall = matched gold spans / gold spans. At ``iou >= 0.5`` a span can
  only match one disjoint span on the other side (two disjoint spans cannot both cover
  more than half of it), so the rule is one-to-one in practice without an assignment step.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SPAN_IOU", "PostScore", "characters", "offset_runs", "char_f1", "span_iou", "score_post",
           "span_precision_recall"]

SPAN_IOU = 0.5


def characters(spans) -> set[tuple[str, int]]:
    """The ``(label, offset)`` pairs covered by spans ``(label, start, end)``."""
    return {(label, i) for label, start, end in spans for i in range(start, end)}


def offset_runs(offsets, label: str) -> list[tuple[str, int, int]]:
    """Turn a set of character offsets into maximal contiguous spans ``(label, start, end)``.

    >>> offset_runs([8, 9, 10, 14, 15], "toxic")
    [('toxic', 8, 11), ('toxic', 14, 16)]
    """
    runs: list[tuple[str, int, int]] = []
    for i in sorted(set(offsets)):
        if runs and runs[-1][2] == i:
            runs[-1] = (label, runs[-1][1], i + 1)
        else:
            runs.append((label, i, i + 1))
    return runs


def char_f1(predicted: set, gold: set) -> float:
    """SemEval-2021 Task 5 character F1 of one post (both empty: 1; one side empty: 0).

    >>> char_f1(set(), set()), char_f1({1}, set()), char_f1(set(), {1}), char_f1({1, 2}, {2, 3})
    (1.0, 0.0, 0.0, 0.5)
    """
    if not gold and not predicted:
        return 1.0
    if not gold or not predicted:
        return 0.0
    return 2 * len(predicted & gold) / (len(predicted) + len(gold))


def span_iou(a: tuple[str, int, int], b: tuple[str, int, int]) -> float:
    """Character intersection over union of two spans; 0 when their labels differ."""
    if a[0] != b[0]:
        return 0.0
    inter = max(0, min(a[2], b[2]) - max(a[1], b[1]))
    union = (a[2] - a[1]) + (b[2] - b[1]) - inter
    return inter / union if union else 0.0


@dataclass(frozen=True)
class PostScore:
    """The scores of one post: its character F1 and the span counts behind precision and recall."""

    char_f1: float
    n_pred_spans: int
    n_gold_spans: int
    matched_pred: int  # predicted spans that match a gold span
    matched_gold: int  # gold spans matched by a predicted span


def score_post(predicted, gold, *, iou: float = SPAN_IOU) -> PostScore:
    """Score one post's predicted spans against its gold spans (both ``(label, start, end)``)."""
    predicted, gold = sorted(set(predicted)), sorted(set(gold))
    return PostScore(
        char_f1=char_f1(characters(predicted), characters(gold)),
        n_pred_spans=len(predicted), n_gold_spans=len(gold),
        matched_pred=sum(any(span_iou(p, g) >= iou for g in gold) for p in predicted),
        matched_gold=sum(any(span_iou(p, g) >= iou for p in predicted) for g in gold),
    )


def span_precision_recall(scores: list[PostScore]) -> dict:
    """Micro span precision, recall and F1 over posts; precision/recall are None with no span to count."""
    pred = sum(s.n_pred_spans for s in scores)
    gold = sum(s.n_gold_spans for s in scores)
    precision = sum(s.matched_pred for s in scores) / pred if pred else None
    recall = sum(s.matched_gold for s in scores) / gold if gold else None
    if precision is None or recall is None:
        f1 = None
    else:
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"span_precision": precision, "span_recall": recall, "span_f1": f1}
