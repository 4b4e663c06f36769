"""The evaluation sentiment classifier: a multinomial Naive Bayes over word uni- and bigrams.

It is deliberately not the training reward (VADER), so a policy that games VADER's lexicon is
not graded by the same lexicon. Training data is either the synthetic world's labelled reviews
(`generate_labelled_reviews`, the offline demo) or a labelled text file with one
"<label> <text>" per line, label 1 = positive and 0 = negative (the SST-2 `stsa.binary.*`
format).

Model: P(y | x) is proportional to P(y) * prod_w P(w | y)^count(w, x), with
P(w | y) = (count(w, y) + alpha) / (sum_w' count(w', y) + alpha * |V|) (Laplace smoothing).
Features that never occur in training are ignored at prediction time.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path

from pipeline.core.errors import DataError
from pipeline.data.world import generate_labelled_reviews

WORLD = "world"
WORLD_TRAIN_SIZE = 4000  # labelled world reviews for the demo classifier
_WORD = re.compile(r"[a-z0-9']+|[!?]")


def features(text: str, ngram_max: int = 2) -> Counter:
    """Counts of lower-cased word n-grams (n = 1..ngram_max); '!' and '?' count as words."""
    words = _WORD.findall(text.lower())
    return Counter(" ".join(words[i:i + n]) for n in range(1, ngram_max + 1) for i in range(len(words) - n + 1))


class NaiveBayesClassifier:
    """Binary multinomial Naive Bayes. Build it with `fit`; `predict_proba` gives P(positive)."""

    def __init__(self, log_prior: dict[int, float], log_likelihood: dict[int, dict[str, float]], ngram_max: int):
        self.log_prior = log_prior
        self.log_likelihood = log_likelihood
        self.ngram_max = ngram_max

    @classmethod
    def fit(cls, texts: list[str], labels: list[int], *, alpha: float = 1.0, ngram_max: int = 2):
        """Count features per class and turn them into smoothed log-probabilities.

        Raises: DataError if labels are not all 0/1 or one class has no example.
        """
        if set(labels) != {0, 1}:
            raise DataError(f"Classifier training labels must include both 0 and 1 and nothing else, "
                            f"got {sorted(set(labels))}.")
        counts = {0: Counter(), 1: Counter()}
        for text, label in zip(texts, labels, strict=True):
            counts[label].update(features(text, ngram_max))
        vocab = set(counts[0]) | set(counts[1])
        log_prior = {y: math.log(labels.count(y) / len(labels)) for y in (0, 1)}
        log_likelihood = {}
        for y in (0, 1):
            denominator = sum(counts[y].values()) + alpha * len(vocab)
            log_likelihood[y] = {w: math.log((counts[y][w] + alpha) / denominator) for w in vocab}
        return cls(log_prior, log_likelihood, ngram_max)

    def predict_proba(self, texts: list[str]) -> list[float]:
        """P(label = 1 | text) for each text (the prior alone for a text with no known feature)."""
        probs = []
        for text in texts:
            score = {y: self.log_prior[y] for y in (0, 1)}
            for w, c in features(text, self.ngram_max).items():
                if w in self.log_likelihood[0]:
                    for y in (0, 1):
                        score[y] += c * self.log_likelihood[y][w]
            probs.append(1.0 / (1.0 + math.exp(min(score[0] - score[1], 700.0))))
        return probs

    def predict(self, texts: list[str]) -> list[int]:
        """1 where P(positive) >= 0.5, else 0."""
        return [int(p >= 0.5) for p in self.predict_proba(texts)]

    def accuracy(self, texts: list[str], labels: list[int]) -> float:
        """Share of texts whose predicted label equals the given one."""
        return sum(p == y for p, y in zip(self.predict(texts), labels, strict=True)) / len(labels)


def read_labelled_file(path: str | Path) -> list[tuple[str, int]]:
    """Read "<label> <text>" lines (label 0 or 1; blank lines skipped).

    Raises: DataError naming the file and line when the file is missing or a line is malformed.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"Labelled file '{path}' not found: pass 'world' or a file of '<0|1> <text>' lines.")
    pairs = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        label, _, text = line.partition(" ")
        if label not in ("0", "1") or not text.strip():
            raise DataError(f"{path}:{number}: expected '<0|1> <text>', got {line[:60]!r}.")
        pairs.append((text.strip(), int(label)))
    if not pairs:
        raise DataError(f"Labelled file '{path}' has no lines: it needs '<0|1> <text>' lines.")
    return pairs


def check_classifier_data(params) -> None:
    """'evaluate.classifier_data' of a sentiment run, where not 'world': UTF-8 '<0|1> <text>' lines, each parsed
    (read_labelled_file); raises DataError naming the key, the file (and line) and the fix."""
    from pipeline.data.inputs import check_utf8

    source = params.evaluate.classifier_data
    if params.run.task != "sentiment" or source == WORLD:
        return
    if not Path(source).is_file():
        raise DataError(f"'evaluate.classifier_data' = {source!r}: no such file; fix the path in params.yaml "
                        f"(relative paths start at the project root) or use 'world'.")
    check_utf8(Path(source))
    try:
        read_labelled_file(source)
    except DataError as error:
        raise DataError(f"'evaluate.classifier_data': {error}") from None


def train_sentiment_classifier(source: str, *, seed: int) -> NaiveBayesClassifier:
    """Fit the classifier on `source`: 'world' (labelled synthetic reviews) or a labelled file."""
    pairs = generate_labelled_reviews(WORLD_TRAIN_SIZE, seed=seed) if source == WORLD else read_labelled_file(source)
    return NaiveBayesClassifier.fit([t for t, _ in pairs], [y for _, y in pairs])
