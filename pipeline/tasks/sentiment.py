"""Sentiment task: continue a movie-review opening positively.

- Demo (``world.source: world``): the synthetic review world (pipeline/data/world.py); reward
  = VADER compound (pipeline/rewards/sentiment.py).
- Local data / paper: a JSONL/CSV/Parquet file or folder of reviews with a ``text`` column
  (HF ``imdb`` schema: text, label) or ``review`` (text2vec's IMDB sample). Reviews of at most
  ``MIN_REVIEW_CHARS`` characters are dropped (the paper kept reviews longer than 200 chars),
  ``<br />`` tags become spaces, and a query is the first k words of a review, k uniform in
  [world.prefix_min_words, world.prefix_max_words] per prompt (seeded). The paper counted
  4-10 GPT-2 *tokens*; drlc counts words because the prompts are built before any
  tokenizer exists. Paper reward: ``score.scorer: hf_classifier`` with the POSITIVE logit.
- Evaluation: % positive by a naive Bayes classifier that is not the reward (DExperts).
"""
from __future__ import annotations

import random
import re

from pipeline.errors import ConfigError, DataError
from pipeline.tasks import prefix_prompt_splits

SCORERS = ("vader", "hf_classifier")
MIN_REVIEW_CHARS = 200
TEXT_COLUMNS = ("text", "review")


def build(world, *, seed: int) -> tuple[list[str], dict[str, list[dict]]]:
    """(corpus, {"train": prompts, "eval": prompts}); see the module docstring for the sources."""
    if world.source == "world":
        from pipeline.data.world import generate_reviews, review_prefixes

        return generate_reviews(world.n_reviews, seed=seed), prefix_prompt_splits(review_prefixes, world, seed=seed)
    return _build_local(world, seed=seed)


def _build_local(world, *, seed: int) -> tuple[list[str], dict[str, list[dict]]]:
    from pipeline.data.local import field, pick_column, read_records, split_items

    records = read_records(world.source)
    column = pick_column(records, TEXT_COLUMNS, source=world.source, what="review text")
    reviews = [re.sub(r"\s+", " ", str(field(r, column)).replace("<br />", " ")).strip() for r in records]
    reviews = [r for r in reviews if len(r) > MIN_REVIEW_CHARS]
    if not reviews:
        raise DataError(f"Data source '{world.source}' has no review longer than {MIN_REVIEW_CHARS} characters "
                        f"in column '{column}': use a file of full reviews.")
    splits = split_items(reviews, n_train=world.n_train_prompts, n_eval=world.n_eval_prompts, seed=seed,
                         source=world.source)
    lengths = random.Random(f"drlc-query-lengths:{seed}")
    prompts = {split: [{"text": " ".join(r.split()[:lengths.randint(world.prefix_min_words, world.prefix_max_words)]),
                        "reference": ""} for r in items] for split, items in splits.items()}
    return reviews[:world.n_reviews], prompts


def make_reward(score):
    """The environment reward of the ScoreParams section (vader, or hf_classifier's POSITIVE logit)."""
    from pipeline.rewards.sentiment import ClassifierSentiment, VaderReward

    if score.scorer == "vader":
        return VaderReward(scale=score.scale)
    if not score.model:
        raise ConfigError("'score.scorer' = 'hf_classifier' needs 'score.model': a saved HF text classifier "
                          "folder such as a local copy of lvwerra/distilbert-imdb.")
    return ClassifierSentiment(score.model, label=score.label or "POSITIVE", scale=score.scale,
                               batch_size=score.batch_size)


def critic_fields(row: dict) -> dict[str, str]:
    return {"response": row["response"]}


class Evaluator:
    """positive_percent: share of samples a naive Bayes classifier (not the reward) calls positive."""

    def __init__(self, classifier_data: str, *, seed: int) -> None:
        from pipeline.evaluate.classifier import train_sentiment_classifier

        self.classifier = train_sentiment_classifier(classifier_data, seed=seed)

    def metrics(self, texts_by_prompt: list[list[str]], prompts: list[dict]) -> tuple[dict, list]:
        from pipeline.evaluate.metrics import positive_percent

        positive = self.classifier.predict_proba([t for texts in texts_by_prompt for t in texts])
        return {"positive_percent": positive_percent(positive)}, positive


def make_evaluator(evaluate, reward, *, seed: int) -> Evaluator:
    return Evaluator(evaluate.classifier_data, seed=seed)
