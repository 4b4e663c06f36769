"""The sentiment environment rewards (VADER, the world classifier) and the toxicity world classifier."""

from importlib.metadata import version

from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

from pipeline.rewards.sentiment import VaderReward

TEXTS = [
    "The plot was wonderful and I loved the soundtrack!",
    "The acting was terrible and the ending was boring.",
    "I watched the film.",
    "The plot was not good.",
    "",
]


def test_sign_on_obvious_examples():
    positive, negative, neutral, negated, empty = VaderReward().score(TEXTS)
    assert positive > 0.5
    assert negative < -0.5
    assert neutral == 0.0 and empty == 0.0
    assert negated < 0


def test_equals_the_analyzer_compound_whatever_score_scale_says():
    from pipeline.core.config import ScoreParams
    from pipeline.tasks import get_task

    analyzer = SentimentIntensityAnalyzer()
    direct = [analyzer.polarity_scores(text)["compound"] for text in TEXTS]
    assert VaderReward().score(TEXTS) == direct
    # score.scale is applied once, afterwards (pipeline/rewards/shaping.py): the reward is in the task's units
    assert get_task("sentiment").make_reward(ScoreParams(scale=2.5)).score(TEXTS) == direct


def test_name_version_and_empty_batch():
    reward = VaderReward()
    assert reward.name == "vader"
    assert reward.version == version("vaderSentiment")
    assert reward.score([]) == []


def test_the_world_classifier_is_naive_bayes_on_the_worlds_tone_labels_in_task_units():
    from pipeline.core.config import ScoreParams
    from pipeline.data.world import generate_labelled_reviews
    from pipeline.evaluate.naive_bayes import NaiveBayesClassifier
    from pipeline.tasks import get_task

    task = get_task("sentiment")
    reward = task.make_reward(ScoreParams(scorer="world_classifier", scale=7.0))  # the scale is shaping's, not here
    pairs = generate_labelled_reviews(4000, seed=7919)
    expected = NaiveBayesClassifier.fit([t for t, _ in pairs], [y for _, y in pairs]).predict_proba(TEXTS)
    scores = reward.score(TEXTS)
    assert scores == list(expected)
    assert all(0.0 <= s <= 1.0 for s in scores) and scores[0] > 0.5 > scores[1]
    assert task.reward_range(ScoreParams(scorer="world_classifier")) == (0.0, 1.0)


def test_the_toxicity_world_classifier_is_naive_bayes_on_the_worlds_comment_labels():
    from pipeline.core.config import ScoreParams
    from pipeline.data.toxicity_world import generate_labelled_comments
    from pipeline.evaluate.naive_bayes import NaiveBayesClassifier
    from pipeline.tasks import get_task

    reward = get_task("toxicity").make_reward(ScoreParams(scorer="world_classifier"))
    pairs = generate_labelled_comments(4000, seed=7919, stream="drlc-study-labelled-comments")
    toxic = NaiveBayesClassifier.fit([t for t, _ in pairs], [int(y) for _, y in pairs])
    texts = ["You are an idiot and a fool", "Thanks for the helpful comment", "The"]
    assert reward.score(texts) == [1.0 - p for p in toxic.predict_proba(texts)]
    assert reward.score(texts)[0] < 0.5 < reward.score(texts)[1]
