"""The sentiment environment reward: VADER's compound score of each response.

This is where the sentiment task's environment reward is computed. VADER is a lexicon and
rule scorer (no model weights, no network), so it runs offline and is deterministic; its
compound score lies in [-1, 1], positive for positive text. The paper profile instead reads
the POSITIVE logit of a HF classifier (``ClassifierSentiment``, lvwerra/distilbert-imdb). The synthetic
world's study profile (configs/study-sentiment.yaml) reads ``WorldClassifierSentiment``: a reward that is not
a re-reading of the lexicon critic.
"""

from __future__ import annotations

from importlib.metadata import version as _package_version

from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer


class VaderReward:
    """Scores texts with VADER's compound sentiment.

    Attributes: name ("vader") and version (the installed vaderSentiment version), recorded
    in the scores table as ``scorer`` and ``scorer_version``.
    """

    name = "vader"
    version = _package_version("vaderSentiment")
    RANGE = (-1.0, 1.0)  # VADER's compound is in [-1, 1]

    def __init__(self) -> None:
        self._analyzer = SentimentIntensityAnalyzer()

    def score(self, texts: list[str], *, references: list[str] | None = None) -> list[float]:
        """Return the compound score of each text, in order (one VADER call per text; references unused)."""
        return [self._analyzer.polarity_scores(text)["compound"] for text in texts]


class WorldClassifierSentiment:
    """P(positive) in [0, 1] under a naive Bayes classifier fit on sequence-level tone labels of the synthetic
    review world (`score.scorer: world_classifier`).

    The labels are each review's tone, not its words' (pipeline/data/world.py generate_labelled_reviews), drawn
    from a seed stream of their own (world seed 0 + CLASSIFIER_SEED), so the classifier never sees the VADER
    lexicon the lexicon critic reads, and differs from evaluate's classifier (trained with the world seed).
    """

    name = "world_classifier"
    version = "nb-4000-7919"
    RANGE = (0.0, 1.0)
    CLASSIFIER_SEED = 7_919
    CLASSIFIER_SIZE = 4_000

    def __init__(self) -> None:
        from pipeline.data.world import generate_labelled_reviews
        from pipeline.evaluate.naive_bayes import NaiveBayesClassifier

        pairs = generate_labelled_reviews(self.CLASSIFIER_SIZE, seed=self.CLASSIFIER_SEED)
        self.classifier = NaiveBayesClassifier.fit([t for t, _ in pairs], [y for _, y in pairs])

    def score(self, texts: list[str], *, references: list[str] | None = None) -> list[float]:
        return list(self.classifier.predict_proba(texts))


class ClassifierSentiment:
    """The raw logit of `label` (default POSITIVE) of a HF text classifier, batched.

    Raises: ConfigError (from HFClassifier) if the model cannot be loaded or lacks the label.
    """

    RANGE = (None, None)  # a raw logit: unbounded

    def __init__(self, model: str, *, label: str = "POSITIVE", batch_size: int = 64) -> None:
        from pipeline.rewards.hf_classifier import HFClassifier

        self.classifier = HFClassifier(model, label=label, output="logit", batch_size=batch_size)
        self.name, self.version = self.classifier.name, self.classifier.version

    def to(self, device) -> ClassifierSentiment:
        self.classifier.to(device)
        return self

    @property
    def device(self) -> str:
        return self.classifier.device

    def score(self, texts: list[str], *, references: list[str] | None = None) -> list[float]:
        return list(self.classifier.values(texts))
