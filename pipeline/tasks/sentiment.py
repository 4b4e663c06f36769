"""Sentiment task: continue a movie-review opening positively.

- Demo (``world.source: world``): the synthetic review world (pipeline/data/world.py); reward
  = VADER compound (pipeline/rewards/sentiment.py).
- Local data / paper: any source of pipeline/data/local.py (files, a ``save_to_disk`` folder or
  ``hub:stanfordnlp/imdb``) with a ``text`` column (HF ``imdb`` schema: text, label) or
  ``review`` (text2vec's IMDB sample). ``<br />`` tags become spaces; reviews of at most
  ``world.min_text_chars`` characters are dropped (the paper's IMDB filter, as TRL's example:
  ``len(review) > 200``). A query is the first k units of a review, k uniform in
  [world.prefix_min_words, world.prefix_max_words] per prompt (seeded), where the unit is
  ``world.prefix_unit``: ``words``, or ``tokens`` of the pretrained base tokenizer
  (``base.model``; the paper's queries are 4-10 GPT-2 tokens, decoded back to text as TRL did).
  With ``tokens`` the two prefix keys count tokens, despite their names.
  Paper reward: ``score.scorer: hf_classifier`` with the POSITIVE logit.
- Evaluation: % positive by a naive Bayes classifier that is not the reward (DExperts).
"""
from __future__ import annotations

import random
import re

from pipeline.core.errors import ConfigError, DataError
from pipeline.tasks import prefix_prompt_splits

SCORERS = ("vader", "hf_classifier", "world_classifier")
MODEL_SCORERS = ("hf_classifier",)  # scorers that read score.model
DATA_SCORERS = ()  # scorers fit at load time to score.train_data
EVAL_NEEDS_REFERENCES = False  # evaluation scores against each prompt's reference
TEXT_COLUMNS = ("text", "review")


def build(world, *, seed: int, tokenizer=None) -> tuple[list[str], dict[str, list[dict]]]:
    """(corpus, {"train": prompts, "eval": prompts}); see the module docstring for the sources.

    tokenizer: the base tokenizer, needed (only) when ``world.prefix_unit`` is ``tokens``.
    Raises: ConfigError for token prefixes without a tokenizer or on the synthetic world;
    DataError for a source without a review column or without reviews after filtering.
    """
    if world.prefix_unit == "tokens" and (tokenizer is None or world.source == "world"):
        raise ConfigError("'world.prefix_unit' = 'tokens' needs review data ('world.source' a file, save_to_disk "
                          "folder or hub:<id>) and a pretrained tokenizer ('base.model' set); else use 'words'.")
    if world.source == "world":
        from pipeline.data.world import generate_reviews, review_prefixes

        return generate_reviews(world.n_reviews, seed=seed), prefix_prompt_splits(review_prefixes, world, seed=seed)
    return _build_local(world, seed=seed, tokenizer=tokenizer)


def _build_local(world, *, seed: int, tokenizer) -> tuple[list[str], dict[str, list[dict]]]:
    from pipeline.data.local import field, pick_column, read_records, split_items

    records = read_records(world.source)
    column = pick_column(records, TEXT_COLUMNS, source=world.source, what="review text")
    reviews = [re.sub(r"\s+", " ", str(field(r, column)).replace("<br />", " ")).strip() for r in records]
    reviews = [r for r in reviews if len(r) > world.min_text_chars]
    if not reviews:
        raise DataError(f"Data source '{world.source}' has no review longer than {world.min_text_chars} characters "
                        f"in column '{column}': use a file of full reviews or lower 'world.min_text_chars'.")
    splits = split_items(reviews, n_train=world.n_train_prompts, n_eval=world.n_eval_prompts, seed=seed,
                         source=world.source)
    lengths = random.Random(f"drlc-query-lengths:{seed}")
    prompts = {split: [{"text": _prefix(review, lengths.randint(world.prefix_min_words, world.prefix_max_words),
                                        tokenizer if world.prefix_unit == "tokens" else None),
                        "reference": ""} for review in items] for split, items in splits.items()}
    return reviews[:world.n_reviews], prompts


def _prefix(review: str, k: int, tokenizer) -> str:
    """The first k words of `review`, or (with a tokenizer) its first k tokens decoded as TRL's example did."""
    if tokenizer is None:
        return " ".join(review.split()[:k])
    return tokenizer.decode(tokenizer(review, add_special_tokens=False)["input_ids"][:k])


def reward_range(score) -> tuple[float | None, float | None]:
    """The bounds of make_reward(score)'s rewards, in the task's units (vader: [-1, 1]; world_classifier: [0, 1];
    a classifier logit: unbounded)."""
    from pipeline.rewards.sentiment import ClassifierSentiment, VaderReward, WorldClassifierSentiment

    return {"vader": VaderReward, "world_classifier": WorldClassifierSentiment}.get(score.scorer,
                                                                                   ClassifierSentiment).RANGE


def make_reward(score):
    """The environment reward of the ScoreParams section (vader, world_classifier's P(positive), or
    hf_classifier's POSITIVE logit)."""
    from pipeline.rewards.sentiment import ClassifierSentiment, VaderReward, WorldClassifierSentiment

    if score.scorer == "vader":
        return VaderReward()
    if score.scorer == "world_classifier":
        return WorldClassifierSentiment()
    if not score.model:
        raise ConfigError("'score.scorer' = 'hf_classifier' needs 'score.model': a saved HF text classifier "
                          "folder such as a local copy of lvwerra/distilbert-imdb.")
    return ClassifierSentiment(score.model, label=score.label or "POSITIVE", batch_size=score.batch_size)


def critic_fields(row: dict) -> dict[str, str]:
    return {"response": row["response"]}


class Evaluator:
    """positive_percent: share of samples a naive Bayes classifier (not the reward) calls positive."""

    def __init__(self, classifier_data: str, *, seed: int) -> None:
        from pipeline.evaluate.naive_bayes import train_sentiment_classifier

        self.classifier = train_sentiment_classifier(classifier_data, seed=seed)

    def metrics(self, texts_by_prompt: list[list[str]], prompts: list[dict]) -> tuple[dict, list]:
        from pipeline.evaluate.metrics import positive_percent

        positive = self.classifier.predict_proba([t for texts in texts_by_prompt for t in texts])
        return {"positive_percent": positive_percent(positive)}, positive


def make_evaluator(evaluate, reward, *, seed: int) -> Evaluator:
    return Evaluator(evaluate.classifier_data, seed=seed)
