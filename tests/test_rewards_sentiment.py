"""The VADER environment reward."""

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
