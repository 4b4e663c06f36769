"""Reward shaping in one place (pipeline/rewards/shaping.py): score.scale and score.normalize change what PPO reads
(scores.env_reward_shaped) and nothing else. The critic's threshold, its answers, drlc estimate's critiqued share and
the range check all read the task's units, so the same responses are critiqued, with the same span rewards, at any
scale or normalisation."""
import dataclasses
import json
from pathlib import Path

import pytest
from conftest import train_bpe

from pipeline.commands.estimate import critique_rate, measured_critique_rate
from pipeline.core import store
from pipeline.core.config import load_params
from pipeline.rewards.shaping import shape, z_normalize
from pipeline.steps.critique import critique
from pipeline.steps.score import score_round
from pipeline.tasks import get_task

ROOT = Path(__file__).resolve().parents[1]
TASK = "tasks/commongen.py"
CONCEPTS = ["field", "look", "stand"]
# coverage 1, 2/3, 0, 1/3 and 2/3: at the profile's threshold 0.99 (coverage units) all but the first are critiqued
RESPONSES = [" A man stood in a field, looking up.", " The fields look green.", " Nothing nothing nothing.",
             " Stand here.\nMore text here", " We look at them standing there."]


def test_shape_by_hand():
    assert shape([0.5, -1.0, 2.0]) == [0.5, -1.0, 2.0]
    assert shape([0.5, -1.0, 2.0], scale=4.0) == [2.0, -4.0, 8.0]
    # mean 1, population std sqrt(2/3): scaling first changes nothing once normalised
    assert shape([0.0, 1.0, 2.0], scale=3.0, normalize=True) == pytest.approx([-1.5 ** 0.5, 0.0, 1.5 ** 0.5])
    assert shape([0.0, 1.0, 2.0], normalize=True) == pytest.approx(z_normalize([0.0, 3.0, 6.0]))
    assert shape([], scale=2.0, normalize=True) == []


@pytest.fixture
def round_inputs(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the profile's task file, rule critic and template, as a run reads them
    tokenizer = train_bpe(RESPONSES * 20 + ["Write a sentence using the words"], vocab_size=300)
    tokenizer.save_pretrained(tmp_path / "tok")
    prompt = get_task(TASK).module.prompt({"text": " ".join(CONCEPTS)})
    prompts = [{"prompt_id": "p0", "text": prompt["prompt"], "reference": "",
                "columns": json.dumps({"concepts": CONCEPTS})}]
    rollouts = [{"rollout_id": f"r{i}", "prompt_id": "p0", "query": prompt["prompt"], "response": text,
                 "response_ids": tokenizer(text).input_ids} for i, text in enumerate(RESPONSES)]
    return tmp_path, prompts, rollouts


def scored_and_critiqued(tmp_path, prompts, rollouts, params):
    scores, _ = score_round(rollouts, prompts, task=TASK, run_id="t", round_=1, params=params.score)
    critic = dataclasses.replace(params.critic, cache_dir=str(tmp_path / "cache"))
    annotations, _ = critique(rollouts, scores, critic=critic, tokenizer_dir=str(tmp_path / "tok"), run_id="t",
                              round_=1, task=TASK, prompt_rows=prompts)
    return scores, annotations


@pytest.mark.parametrize("overrides", [["score.scale=10"], ["score.scale=12.36"], ["score.normalize=true"],
                                       ["score.scale=12.36", "score.normalize=true"]])
def test_the_same_rows_are_critiqued_with_the_same_span_rewards_at_any_scale(round_inputs, overrides):
    tmp_path, prompts, rollouts = round_inputs
    plain = load_params(ROOT / "configs/commongen.yaml")
    shaped = load_params(ROOT / "configs/commongen.yaml", overrides)
    assert plain.critic.threshold == 0.99 and plain.score.scale == 1.0
    scores_1, notes_1 = scored_and_critiqued(tmp_path, prompts, rollouts, plain)
    scores_k, notes_k = scored_and_critiqued(tmp_path, prompts, rollouts, shaped)

    coverage = [1.0, 2 / 3, 0.0, 1 / 3, 2 / 3]
    assert [s["env_reward"] for s in scores_1] == [s["env_reward"] for s in scores_k] == pytest.approx(coverage)
    assert [s["env_reward_shaped"] for s in scores_1] == [s["env_reward"] for s in scores_1]
    assert [s["env_reward_shaped"] for s in scores_k] == pytest.approx(
        shape(coverage, scale=shaped.score.scale, normalize=shaped.score.normalize))
    # the critic saw the same responses: at scale 10 the old plumbing (threshold after the scale) critiqued only r2
    assert [a["critiqued"] for a in notes_1] == [a["critiqued"] for a in notes_k] == [False, True, True, True, True]
    assert [a["token_rewards"] for a in notes_k] == [a["token_rewards"] for a in notes_1]
    assert [a["cache_key"] for a in notes_k] == [a["cache_key"] for a in notes_1]
    assert all(a["cache_hit"] for a in notes_k if a["critiqued"])  # the second arm pays nothing
    assert any(sum(a["token_rewards"]) for a in notes_1)


@pytest.mark.parametrize("overrides", [["score.scale=10"], ["score.normalize=true"]])
def test_estimate_reads_the_critiqued_share_and_the_range_in_the_tasks_units(round_inputs, overrides):
    tmp_path, prompts, rollouts = round_inputs
    plain = load_params(ROOT / "configs/commongen.yaml")
    shaped = load_params(ROOT / "configs/commongen.yaml", overrides)
    for name, params in (("plain", plain), ("shaped", shaped)):
        scores, _ = score_round(rollouts, prompts, task=TASK, run_id="t", round_=1, params=params.score)
        store.write_table(scores, "scores", store.partition_dir(tmp_path / name, "scores", 1))
    assert measured_critique_rate(shaped, tmp_path / "shaped") == measured_critique_rate(plain, tmp_path / "plain") \
        == pytest.approx(4 / 5)
    # the range check: threshold 1.0 reaches coverage's maximum 1 at any scale (every response critiqued)
    every = load_params(ROOT / "configs/commongen.yaml", overrides + ["critic.threshold=1.0"])
    assert critique_rate(every) == (1.0, "threshold 1 >= the scorer's maximum 1: every response")


def test_the_summarization_critic_is_shown_the_score_in_the_tasks_units():
    """demo-summarization shapes ROUGE-1 x 100 by score.scale 0.01; the critic reads the task's number."""
    params = load_params(ROOT / "configs/demo-summarization.yaml")
    assert params.score.scale == 0.01 and params.critic.threshold == 50.0  # both read in ROUGE-1 F1 x 100
    rollouts = [{"rollout_id": "r0", "prompt_id": "p0", "query": "doc TL;DR:", "response": " a b"}]
    prompts = [{"prompt_id": "p0", "reference": "a b c d"}]
    scores, _ = score_round(rollouts, prompts, task="summarization", run_id="t", round_=1, params=params.score)
    assert scores[0]["env_reward"] == pytest.approx(100 * 2 * (2 / 2 * 2 / 4) / (2 / 2 + 2 / 4))  # F1 of 1 and 0.5
    assert scores[0]["env_reward_shaped"] == pytest.approx(0.01 * scores[0]["env_reward"])
    fields = get_task("summarization").critic_fields(rollouts[0] | {"env_reward": scores[0]["env_reward"]})
    assert fields["score"] == "66.7"
