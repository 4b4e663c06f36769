"""The synthetic review world: determinism, vocabulary, polarity mix and the exact recogniser."""

import random

import pytest
from vaderSentiment.vaderSentiment import BOOSTER_DICT, SentimentIntensityAnalyzer

from pipeline.core.errors import ConfigError
from pipeline.data import world

ANALYZER = SentimentIntensityAnalyzer()


@pytest.fixture(scope="module")
def reviews():
    return world.generate_reviews(2000, seed=7)


def test_generation_is_deterministic_and_seed_dependent():
    assert world.generate_reviews(50, seed=3) == world.generate_reviews(50, seed=3)
    assert world.generate_reviews(50, seed=3) != world.generate_reviews(50, seed=4)
    assert world.generate_reviews(80, seed=3)[:50] == world.generate_reviews(50, seed=3)
    assert world.review_prefixes(50, seed=3) == world.review_prefixes(50, seed=3)


def test_generation_leaves_the_global_rng_alone():
    random.seed(123)
    state = random.getstate()
    world.generate_reviews(20, seed=1)
    world.review_prefixes(20, seed=1)
    assert random.getstate() == state


def test_prefixes_come_from_a_separate_seed_stream():
    corpus = world.generate_reviews(100, seed=5)
    prefixes = world.review_prefixes(100, seed=5)
    assert sum(review.startswith(prefix) for prefix, review in zip(prefixes, corpus)) < 50


def test_vocabulary_polarity_matches_the_vader_lexicon():
    lexicon = ANALYZER.lexicon
    for words in (world.POSITIVE_ADJECTIVES, world.POSITIVE_VERBS, world.POSITIVE_FEELINGS):
        assert all(lexicon.get(w, 0) > 0 for w in words), [w for w in words if lexicon.get(w, 0) <= 0]
    for words in (world.NEGATIVE_ADJECTIVES, world.NEGATIVE_VERBS, world.NEGATIVE_FEELINGS):
        assert all(lexicon.get(w, 0) < 0 for w in words), [w for w in words if lexicon.get(w, 0) >= 0]
    neutral = world.NEUTRAL_ADJECTIVES + world.NEUTRAL_VERBS + world.WORD_CLASSES["NOUN"]
    neutral += world.WORD_CLASSES["OPENER"] + world.WORD_CLASSES["INTENS"]
    assert [w for w in neutral if w in lexicon] == []
    assert all(w in BOOSTER_DICT for w in world.WORD_CLASSES["INTENS"])
    assert not set(world.WORD_CLASSES["ADJ"]) & set(world.WORD_CLASSES["NOUN"])


def test_world_size_and_shape(reviews):
    assert len(world.TEMPLATES) == 16
    types = {word.strip(",.!").lower() for review in reviews for word in review.split(" ")}
    assert 200 <= len(types) <= 260
    sentence_counts = [review.count(".") + review.count("!") for review in reviews]
    assert min(sentence_counts) == 1 and max(sentence_counts) == 3


def test_polarity_mix_leaves_room_to_become_positive(reviews):
    compounds = [ANALYZER.polarity_scores(review)["compound"] for review in reviews]
    positive = sum(c > 0.05 for c in compounds) / len(compounds)
    negative = sum(c < -0.05 for c in compounds) / len(compounds)
    assert 0.3 < positive < 0.6
    assert 0.3 < negative < 0.6


def test_every_generated_review_and_each_of_its_prefixes_is_grammatical(reviews):
    assert all(world.is_grammatical(review) for review in reviews)
    for review in reviews[:100]:
        assert all(world.is_grammatical(review[:cut]) for cut in range(len(review) + 1)), review


def test_prefixes_are_short_mostly_neutral_and_grammatical():
    prefixes = world.review_prefixes(500, seed=11, min_words=2, max_words=5)
    assert all(2 <= len(p.split(" ")) <= 5 for p in prefixes)
    assert all(world.is_grammatical(p) for p in prefixes)
    neutral = sum(ANALYZER.polarity_scores(p)["compound"] == 0 for p in prefixes)
    assert neutral / len(prefixes) > 0.9


@pytest.mark.parametrize("text", [
    "", "The", "The plot was goo", "The plot was good. ", "Overall, the", "I would not recommend",
    "The plot was good! It was very dull from start to finish.", "I never really loved this ",
])
def test_accepts_grammatical_prefixes(text):
    assert world.is_grammatical(text)


@pytest.mark.parametrize("text", [
    "plot the was good.", "The plot good was.", "The good was plot.", "the plot was good.",
    "The Plot was good.", "The plot was good.The", "The plot  was good.", " The plot",
    "The plot was splendiferous.", "The plot was gooz", "The plot was good.. ", "I not loved the plot.",
    "The plot was good, and", "The plot was good\nThe", "It was good from start to end.",
])
def test_rejects_ungrammatical_texts(text):
    assert not world.is_grammatical(text)


def test_rejects_shuffled_word_order(reviews):
    rng = random.Random(0)
    shuffled = []
    for review in reviews[:300]:
        words = review.split(" ")
        rng.shuffle(words)
        if words != review.split(" "):
            shuffled.append(" ".join(words))
    rejected = sum(not world.is_grammatical(text) for text in shuffled)
    assert rejected / len(shuffled) > 0.98


def test_rejects_a_noun_swapped_with_an_adjective(reviews):
    nouns, adjectives = set(world.WORD_CLASSES["NOUN"]), set(world.WORD_CLASSES["ADJ"])
    checked = 0
    for review in reviews[:300]:
        words = review.split(" ")
        bare = [w.strip(",.!") for w in words]
        noun = next((i for i, w in enumerate(bare) if w in nouns), None)
        adjective = next((i for i, w in enumerate(bare) if w in adjectives), None)
        if noun is None or adjective is None:
            continue
        words[noun] = words[noun].replace(bare[noun], bare[adjective])
        words[adjective] = words[adjective].replace(bare[adjective], bare[noun])
        assert not world.is_grammatical(" ".join(words)), " ".join(words)
        checked += 1
    assert checked > 100


def test_bad_arguments_raise_config_error():
    with pytest.raises(ConfigError, match="n=-1"):
        world.generate_reviews(-1, seed=0)
    with pytest.raises(ConfigError, match="min_words=4"):
        world.review_prefixes(3, seed=0, min_words=4, max_words=2)
