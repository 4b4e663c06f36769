"""The detoxification environment reward: 1 - toxicity of each response.

This is where the toxicity task's environment reward is computed. Offline (demo and
local-data profiles) toxicity comes from ``LexiconToxicity``, a weighted word list combined
as a noisy OR: toxicity = 1 - prod(1 - w) over every occurrence of a listed term, so one
strong insult gives about 0.8 and each further toxic word raises it; text without a listed
term scores 0. It is a crude, transparent proxy (no context, no sarcasm, no identity
attacks without a listed word) that reads the synthetic comment world exactly
(pipeline/data/toxicity_world.py). The paper profiles use a HF classifier
(pipeline/rewards/hf_classifier.py) or the Perspective API (pipeline/rewards/perspective.py);
``ToxicityReward`` turns any of them into the reward ``1 - toxicity``. The synthetic world's study profile
(configs/study-toxicity.yaml) reads ``WorldClassifierToxicity``: a toxicity the lexicon critic does not re-read.
"""
from __future__ import annotations

import re
from functools import lru_cache

from pipeline.data.toxicity_lexicon import TOXIC_TERMS  # the weighted word list, shared with the lexicon critic


@lru_cache(maxsize=1)
def _term_pattern() -> re.Pattern:
    phrases = sorted(TOXIC_TERMS, key=len, reverse=True)
    body = "|".join(r"\s+".join(map(re.escape, p.split())) for p in phrases)
    return re.compile(rf"(?<!\w)(?:{body})(?!\w)", re.IGNORECASE)


def toxic_terms(text: str) -> list[str]:
    """The listed terms in `text`, lower-cased, one per occurrence, in text order."""
    return [" ".join(m.group().lower().split()) for m in _term_pattern().finditer(text)]


class LexiconToxicity:
    """Offline toxicity in [0, 1): noisy OR of the TOXIC_TERMS weights of every occurrence."""

    name = "lexicon"
    version = "1"

    def toxicity(self, texts: list[str]) -> list[float]:
        out = []
        for text in texts:
            clean = 1.0
            for term in toxic_terms(text):
                clean *= 1.0 - TOXIC_TERMS[term]
            out.append(1.0 - clean)
        return out


class WorldClassifierToxicity:
    """P(toxic) under a naive Bayes classifier fit on comment-level labels of the synthetic comment world
    (`score.scorer: world_classifier`).

    The label is the comment's, not its words': a toxic comment's sentences are each toxic with probability 0.8
    (pipeline/data/toxicity_world.py), so the classifier also learns civil words as evidence, and it never reads
    the lexicon the critic names spans with. Its comments come from a seed stream of their own.
    """

    name = "world_classifier"
    version = "nb-4000-7919"
    CLASSIFIER_SEED = 7_919
    CLASSIFIER_SIZE = 4_000
    STREAM = "drlc-study-labelled-comments"

    def __init__(self) -> None:
        from pipeline.data.toxicity_world import generate_labelled_comments
        from pipeline.evaluate.naive_bayes import NaiveBayesClassifier

        pairs = generate_labelled_comments(self.CLASSIFIER_SIZE, seed=self.CLASSIFIER_SEED, stream=self.STREAM)
        self.classifier = NaiveBayesClassifier.fit([t for t, _ in pairs], [int(toxic) for _, toxic in pairs])

    def toxicity(self, texts: list[str]) -> list[float]:
        return list(self.classifier.predict_proba(texts))


class ToxicityReward:
    """reward = 1 - toxicity from any toxicity source with ``toxicity(texts)``."""

    RANGE = (0.0, 1.0)  # every source's toxicity is a probability

    def __init__(self, source) -> None:
        self.source = source
        self.name, self.version = source.name, source.version

    def to(self, device) -> ToxicityReward:
        """Run the source's model on `device` when it has one (a HF classifier; not the lexicon or Perspective)."""
        if hasattr(self.source, "to"):
            self.source.to(device)
        return self

    @property
    def device(self) -> str | None:
        return getattr(self.source, "device", None)

    @property
    def heldout(self) -> dict | None:
        """The source's agreement with Perspective on rows it was not fit to (the fitted scorer), else None."""
        return getattr(self.source, "heldout", None)

    def toxicity(self, texts: list[str]) -> list[float]:
        return self.source.toxicity(texts)

    def score(self, texts: list[str], *, references: list[str] | None = None) -> list[float]:
        """The reward of each text (references are ignored), batched by the source."""
        return [1.0 - t for t in self.source.toxicity(texts)]
