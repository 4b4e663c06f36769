"""The summarization environment reward: ROUGE-1 F1 x 100 of each summary against its reference.

This is where the summarization task's environment reward is computed, and where ROUGE is
implemented: 40 lines of our own, kept on purpose instead of Google's rouge_score package, which
pulls in nltk (and absl-py, joblib) for a stemmer drlc does not use, and instead of Hugging Face's
`evaluate.load("rouge")`, which fetches the metric's script from the Hub at run time (a machine that
has never been online cannot load it) and then calls rouge_score anyway. Tokenization follows
rouge_score's default: lower-case, every run of characters other than a-z and 0-9 is a separator,
no stemming (use_stemmer=False). tests/test_rouge_parity.py checks ROUGE-1, ROUGE-2 and ROUGE-L F1
against rouge_score 0.1.2 (use_stemmer=False) on the 1,945 TL;DR summary/reference pairs of
shared/data plus 100 whole posts: equal to the last bit (largest difference 0.0). With stemming
rouge_score gives other numbers: ROUGE-1 differs on 740 of the 1,945 pairs, by up to 0.13 and by
+1.5 points (x 100) on average. rouge_score's "rougeLsum" (LCS over newline-split sentences) is not
implemented.

- ROUGE-N: n-gram overlap with clipped counts; P = overlap / candidate n-grams, R = overlap /
  reference n-grams, F = 2PR / (P + R) (0 when either is 0).
- ROUGE-L: P = LCS / candidate tokens, R = LCS / reference tokens, F as above (sentence-level,
  the whole text as one sequence, as rouge_score's "rougeL").

The paper's other summarization reward is a reward model (``RewardModelReward``, loading in
pipeline/rewards/reward_model.py); ``score.normalize`` z-normalises it per round in
pipeline/steps/score.py.
"""
from __future__ import annotations

import re
from collections import Counter

from pipeline.core.errors import DataError

_NON_ALNUM = re.compile(r"[^a-z0-9]+")


def rouge_tokens(text: str) -> list[str]:
    return [t for t in _NON_ALNUM.split(text.lower()) if t]


def _f1(overlap: float, n_candidate: int, n_reference: int) -> float:
    if overlap == 0 or n_candidate == 0 or n_reference == 0:
        return 0.0
    precision, recall = overlap / n_candidate, overlap / n_reference
    return 2 * precision * recall / (precision + recall)


def rouge_n(candidate: str, reference: str, n: int) -> float:
    """ROUGE-N F1 of one candidate against one reference."""
    c, r = rouge_tokens(candidate), rouge_tokens(reference)
    c_grams = Counter(tuple(c[i:i + n]) for i in range(len(c) - n + 1))
    r_grams = Counter(tuple(r[i:i + n]) for i in range(len(r) - n + 1))
    overlap = sum((c_grams & r_grams).values())
    return _f1(overlap, sum(c_grams.values()), sum(r_grams.values()))


def lcs_length(a: list[str], b: list[str]) -> int:
    """Length of the longest common subsequence (dynamic programming, O(len(a) * len(b)))."""
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b):
            current.append(previous[j] + 1 if x == y else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def rouge_l(candidate: str, reference: str) -> float:
    """ROUGE-L F1 of one candidate against one reference."""
    c, r = rouge_tokens(candidate), rouge_tokens(reference)
    return _f1(lcs_length(c, r), len(c), len(r))


class RougeReward:
    """reward = 100 * ROUGE-1 F1(response, reference), batched over lists."""

    name = "rouge1"
    version = "drlc-1"
    RANGE = (0.0, 100.0)  # 100 x an F1

    def score(self, texts: list[str], *, references: list[str] | None = None) -> list[float]:
        """Raises DataError if references are missing or do not match the texts one to one."""
        if references is None or len(references) != len(texts) or not all(references):
            raise DataError("The summarization reward needs one reference per response: the prompts table's "
                            "'reference' column is empty or not passed (score stage: --prompts); re-run prepare, or check dvc.yaml.")
        return [100.0 * rouge_n(t, r, 1) for t, r in zip(texts, references)]


class RewardModelReward:
    """reward = the reward-model score of (query, response); the query is the document ending in "TL;DR:".

    ``needs_queries`` tells the score and evaluate steps to pass ``queries=`` (the documents).
    Raises: ConfigError (from RewardModel) for a bad model folder; DataError if the queries
    are missing or do not match the texts one to one.
    """

    needs_queries = True
    RANGE = (None, None)  # a reward model's score is unbounded

    def __init__(self, folder: str, *, batch_size: int = 8) -> None:
        from pipeline.rewards.reward_model import RewardModel

        self.model = RewardModel(folder, batch_size=batch_size)
        self.name, self.version = "reward_model", self.model.version

    def to(self, device) -> RewardModelReward:
        self.model.to(device)
        return self

    @property
    def device(self) -> str:
        return self.model.device

    def score(self, texts: list[str], *, references: list[str] | None = None,
              queries: list[str] | None = None) -> list[float]:
        if queries is None or len(queries) != len(texts):
            raise DataError("The reward-model reward needs the query (document) of every response: the score "
                            "step passes them from the rollouts table; re-run rollout (dvc repro).")
        return list(self.model.score(queries, texts))
