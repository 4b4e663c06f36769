"""The fair sentiment world of the study: what is rewarded, what is measured, what it can show.

Environment reward: P(positive) of the response under a multinomial naive Bayes classifier
(pipeline/evaluate/naive_bayes.py) fit on *sequence-level* tone labels of the synthetic world
(generate_labelled_reviews, its own seed stream), in [0, 1]. The critic is the lexicon backend
(VADER's lexicon, pipeline/critic/offline/lexicon.py): it never sees the classifier, and the classifier
never sees the lexicon. Evaluation uses the task's own classifier (trained with the world seed,
a different sample of labelled reviews) - close to, but not identical with, the reward.

Degradation measures (world-specific): the share of query+response texts the world's grammar
accepts (pipeline.data.world.is_grammatical, exact), the share of polar words in a response that
repeat an earlier polar word of the same response, and polar words per response.

What this world can show: whether per-token credit for sentiment-bearing words speeds up
learning a sequence-level sentiment reward, and whether that speed-up survives controls for
reward scale; reward hacking of a lexical kind (piling up positive words, leaving the grammar).
What it cannot show: sentiment in this world *is* lexical (a review's tone is carried by its
polar words), so a good classifier is close to a lexicon by construction and the critic's spans
are almost always right; there is no critic noise, no long-range credit assignment and no
factual content. A result here is an upper bound on what a real, noisier critic would give.
"""
from __future__ import annotations

import re

from pipeline.core.config import WorldParams
from pipeline.data.world import (
    NEGATIVE_ADJECTIVES,
    NEGATIVE_FEELINGS,
    NEGATIVE_VERBS,
    POSITIVE_ADJECTIVES,
    POSITIVE_FEELINGS,
    POSITIVE_VERBS,
    generate_labelled_reviews,
    is_grammatical,
    review_prefixes,
)
from pipeline.evaluate.metrics import distinct_n, positive_percent
from pipeline.evaluate.naive_bayes import NaiveBayesClassifier, train_sentiment_classifier
from pipeline.tasks import prefix_prompt_splits

ENV_CLASSIFIER_SEED = 7_919  # offset of the reward classifier's seed stream from the world seed
POLAR_WORDS = frozenset(POSITIVE_ADJECTIVES + NEGATIVE_ADJECTIVES + POSITIVE_VERBS + NEGATIVE_VERBS
                        + POSITIVE_FEELINGS + NEGATIVE_FEELINGS)
_WORD = re.compile(r"[A-Za-z]+")


class StudyWorld:
    """What every study world shares: the per-round measures of a batch (dist-2 + the world's `degradation`)."""

    def batch_metrics(self, queries: list[str], responses: list[str]) -> dict:
        """Per-round measures of one batch of rollouts (one response per prompt): dist-2 + degradation."""
        return {"dist_2": distinct_n([responses], 2), **self.degradation(queries, responses)}


class ClassifierStudyWorld(StudyWorld):
    """A world whose environment reward is a naive Bayes classifier fit on `labelled(n, seed=...)` texts
    (the world seed + ENV_CLASSIFIER_SEED) and whose prompts are `prefixes` split by pipeline.tasks."""

    def __init__(self, *, world_seed: int, classifier_size: int, labelled, prefixes, prefix_world):
        pairs = labelled(classifier_size, seed=world_seed + ENV_CLASSIFIER_SEED)
        self.reward_classifier = NaiveBayesClassifier.fit([t for t, _ in pairs], [y for _, y in pairs])
        splits = prefix_prompt_splits(prefixes, prefix_world, seed=world_seed)
        self.train_prompts = [p["text"] for p in splits["train"]]
        self.eval_prompts = [p["text"] for p in splits["eval"]]

    @classmethod
    def from_config(cls, cfg):
        return cls(world_seed=cfg.world_seed, n_train_prompts=cfg.n_train_prompts, n_eval_prompts=cfg.n_eval_prompts,
                   classifier_size=cfg.env_classifier_size)


class SentimentStudyWorld(ClassifierStudyWorld):
    """Prompts, environment reward, degradation measures and evaluation metrics of the study."""

    name = "sentiment"

    def __init__(self, *, world_seed: int, n_train_prompts: int, n_eval_prompts: int, classifier_size: int):
        super().__init__(world_seed=world_seed, classifier_size=classifier_size, labelled=generate_labelled_reviews,
                         prefixes=review_prefixes,
                         prefix_world=WorldParams(n_train_prompts=n_train_prompts, n_eval_prompts=n_eval_prompts))
        self.eval_classifier = train_sentiment_classifier("world", seed=world_seed)

    def env_rewards(self, responses: list[str], queries: list[str] | None = None) -> list[float]:
        """The sparse environment reward of each response: the reward classifier's P(positive)."""
        return self.reward_classifier.predict_proba(responses)

    @staticmethod
    def degradation(queries: list[str], responses: list[str]) -> dict:
        """Grammatical share, repeated-polar-word share and polar words per response of a batch."""
        polar = [[w.lower() for w in _WORD.findall(r) if w.lower() in POLAR_WORDS] for r in responses]
        n_polar = sum(len(p) for p in polar)
        repeats = sum(len(p) - len(set(p)) for p in polar)
        grammatical = sum(is_grammatical(q + r) for q, r in zip(queries, responses, strict=True))
        return {"grammatical": grammatical / len(responses),
                "repeated_polar_share": repeats / n_polar if n_polar else 0.0,
                "polar_per_response": n_polar / len(responses)}

    def eval_metrics(self, queries: list[str], texts_by_prompt: list[list[str]]) -> dict:
        """The task's evaluation metrics on held-out prompts, plus the study's reward and degradation.

        queries: one per prompt; texts_by_prompt: the samples of each prompt.
        """
        texts = [t for group in texts_by_prompt for t in group]
        flat_queries = [q for q, group in zip(queries, texts_by_prompt, strict=True) for _ in group]
        env = self.env_rewards(texts)
        return {
            "positive_percent": positive_percent(self.eval_classifier.predict_proba(texts)),
            "env_reward_mean": sum(env) / len(env),
            "dist_1": distinct_n(texts_by_prompt, 1), "dist_2": distinct_n(texts_by_prompt, 2),
            "dist_3": distinct_n(texts_by_prompt, 3), **self.degradation(flat_queries, texts),
            "n_samples": len(texts),
        }
