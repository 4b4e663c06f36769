"""Each task's reward_range bounds the rewards its make_reward actually gives (drlc estimate reads it)."""
import dataclasses

import pytest

from pipeline.core.config import ScoreParams
from pipeline.tasks import get_task, task_names

TEXTS = ["great wonderful superb amazing love it", "awful terrible horrible hate it", "the cat sat on the mat",
         "you idiot, you stupid moron", "ok"]
OFFLINE = {"sentiment": "vader", "toxicity": "lexicon", "summarization": "rouge1"}


def test_every_task_is_covered():
    assert set(OFFLINE) == set(task_names())


@pytest.mark.parametrize("task", sorted(OFFLINE))
def test_offline_rewards_lie_in_the_declared_range_times_scale(task):
    score = dataclasses.replace(ScoreParams(), scorer=OFFLINE[task], scale=2.5)
    low, high = get_task(task).reward_range(score)
    rewards = get_task(task).make_reward(score).score(TEXTS, references=TEXTS)  # a text is its own best summary
    assert all(low <= r <= high for r in rewards), (rewards, low, high)
    assert max(rewards) == pytest.approx(high, abs=0.2 * high)  # the bound is reached, not just respected


@pytest.mark.parametrize("task, scorer", [("sentiment", "hf_classifier"), ("summarization", "reward_model")])
def test_model_scorers_are_unbounded_and_need_no_model_to_say_so(task, scorer):
    assert get_task(task).reward_range(dataclasses.replace(ScoreParams(), scorer=scorer)) == (None, None)
