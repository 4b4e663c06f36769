"""A task file's declared rewards (pipeline/tasks/_rewards.py): REWARDS with REWARD_WEIGHTS, None for "does not
apply", async rewards awaited together, dict returns' extra numbers, each reward stored per response beside the
weighted total and logged per round, settings from score.settings, and eval prompts read through prompt()."""
import json
import shutil
from pathlib import Path

import pytest
import yaml
from inprocess import drlc

from pipeline.core import store
from pipeline.core.config import ScoreParams, WorldParams, load_params
from pipeline.core.errors import ConfigError, RewardError
from pipeline.steps.score import score_round
from pipeline.tasks import get_task
from test_own_task import check_with, prompt_rows, rollout_rows, write_task

ROOT = Path(__file__).resolve().parents[1]

# rollout_rows(4): responses "one", "one two", "one two three", "one"; prompts q0, q1, q0, q1, each with
# concepts [c0, x] or [c1, x]
TWO_REWARDS = '''import asyncio
from helper import Length
def on_q1(prompts, completions):  # applies to prompt q1 only
    return [2.0 if p == "q1" else None for p in completions and prompts]
async def words(prompts, completions, concepts):
    await asyncio.sleep(0)
    return [{"score": len(c.split()), "concepts": len(k)} for c, k in zip(completions, concepts)]
REWARDS = [on_q1, words, Length()]
REWARD_WEIGHTS = [1.0, 0.5, 0.0]
'''
HELPER = '''class Length:  # a callable object, imported from a helper module of tasks/
    __name__ = "length"
    def __call__(self, prompts, completions, **columns):
        return [float(len(c)) for c in completions]
'''


@pytest.fixture
def project(tmp_path, monkeypatch):
    shutil.copytree(ROOT / "prompts", tmp_path / "prompts")
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks/helper.py").write_text(HELPER)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def scored(text: str, **settings):
    spec = write_task(Path("."), text)
    return score_round(rollout_rows(4), prompt_rows(), task=spec, run_id="t", round_=1,
                       params=ScoreParams(scorer="reward", settings=settings))


def test_declared_rewards_give_a_weighted_total_with_none_left_out_and_each_value_stored(project):
    rows, metrics = scored(TWO_REWARDS)
    # on_q1: None, 2, None, 2; words: 1, 2, 3, 1 (weight 0.5); length: 3, 7, 13, 3 (weight 0)
    assert [r["env_reward"] for r in rows] == [0.5, 3.0, 1.5, 2.5]
    assert rows[1]["rewards"] == {"on_q1": 2.0, "words": 2.0, "words.concepts": 2.0, "length": 7.0}
    assert rows[0]["rewards"]["on_q1"] is None
    assert metrics["rewards"] == {"on_q1": {"mean": 2.0, "applied": 2}, "words": {"mean": 1.75, "applied": 4},
                                  "words.concepts": {"mean": 2.0, "applied": 4}, "length": {"mean": 6.5, "applied": 4}}


def test_each_reward_is_queryable_with_drlc_sql(project):
    rows, _ = scored(TWO_REWARDS)
    store.write_table(rows, "scores", project / "data/scores/round=0001")
    result = drlc(["sql", "SELECT rollout_id, env_reward, rewards['on_q1'] AS q1, rewards['words'] AS words "
                          "FROM scores ORDER BY rollout_id", "--format", "csv"], project)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines() == ["rollout_id,env_reward,q1,words", "r0001-00000,0.5,,1.0",
                                          "r0001-00001,3.0,2.0,2.0", "r0001-00002,1.5,,3.0", "r0001-00003,2.5,2.0,1.0"]


def test_async_rewards_run_concurrently(project):
    """Each waits for the other's event: run one after the other, the first would time out."""
    text = '''import asyncio
EVENTS = {}
def _event(name):
    return EVENTS.setdefault((id(asyncio.get_running_loop()), name), asyncio.Event())
async def ping(prompts, completions):
    _event("ping").set()
    await asyncio.wait_for(_event("pong").wait(), 2)
    return [1.0] * len(completions)
async def pong(prompts, completions):
    _event("pong").set()
    await asyncio.wait_for(_event("ping").wait(), 2)
    return [2.0] * len(completions)
REWARDS = [ping, pong]
'''
    rows, _ = scored(text)
    assert [r["env_reward"] for r in rows] == [3.0] * 4


@pytest.mark.parametrize("text, error, needles", [
    ("def a(p, c):\n    return [None] * len(c)\ndef b(p, c):\n    return [None, 1.0, None, 1.0]\nREWARDS = [a, b]\n",
     RewardError, ["no reward applies to response r0001-00000", "['a', 'b'] returned None"]),
    ("async def a(p, c):\n    raise ValueError('late')\nREWARDS = [a]\n",
     RewardError, ["reward a raised on 4 responses", "mine.py line 2", "ValueError: late"]),
    ("def a(p, c):\n    return [{'value': 1.0}] * len(c)\nREWARDS = [a]\n",
     RewardError, ["reward a returned a dict without 'score'", "put the reward in 'score'"]),
    ("def a(p, c):\n    return [{'score': 1.0, 'n': 'x'}] * len(c)\nREWARDS = [a]\n",
     RewardError, ["reward a.n returned 'x' (str) for response r0001-00000"]),
    ("def a(p, c):\n    return [1.0] * len(c)\nREWARDS = [a]\nREWARD_WEIGHTS = [1.0, 2.0]\n",
     ConfigError, ["REWARD_WEIGHTS of tasks/mine.py = [1.0, 2.0]", "one number (or score.settings key) per reward"]),
    ("def a(p, c):\n    return [1.0] * len(c)\nREWARDS = [a]\nREWARD_WEIGHTS = ['w']\n",
     ConfigError, ["REWARD_WEIGHTS of tasks/mine.py names 'w'", "'score.settings.w' = None", "set it to a number"]),
    ("def a(p, c):\n    return [1.0] * len(c)\nREWARDS = [a, a]\n", ConfigError, ["names ['a'] twice"]),
    ("REWARDS = ['a']\n", ConfigError, ["REWARDS of tasks/mine.py = ['a']", "list of functions"]),
    ("def a(p, c, threshold):\n    return [threshold] * len(c)\nREWARDS = [a]\n",
     RewardError, ["reward a (tasks/mine.py) reads ['threshold']", "score.settings []"]),
])
def test_a_mistake_in_declared_rewards_is_one_error_naming_it(project, text, error, needles):
    with pytest.raises(error) as raised:
        scored(text)
    for needle in needles:
        assert needle in str(raised.value), str(raised.value)


def test_a_setting_reaches_the_rewards_that_name_it(project):
    text = ("def a(p, c, threshold, scale=1.0):\n    return [scale * (len(x) > threshold) for x in c]\n"
            "def b(p, c, **kw):\n    return [float(len(kw))] * len(c)\nREWARDS = [a, b]\n")
    rows, _ = scored(text, threshold=4, scale=2.0)
    # a: "one" 3 > 4 no, "one two" yes, "one two three" yes, "one" no; b sees concepts, threshold and scale: 3
    assert [r["env_reward"] for r in rows] == [3.0, 5.0, 5.0, 3.0]


def test_a_settings_change_changes_the_score_params_only():
    """score.settings lives in the score section, which rollout does not read: a sweep re-runs score onwards."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert "score" in stages["score"]["do"]["params"]
    assert not any(p == "score" or str(p).startswith("score.") for p in stages["rollout"]["do"]["params"])
    assert load_params(ROOT / "params.yaml", ["score.settings.min_words=3"]).score.settings == {"min_words": 3}


# -- eval prompts through the same prompt(), and drlc check of the rewards' arguments -------------------------------
PROMPTED = '''def prompt(record):
    words = record["set"].split("#")
    return {"prompt": "Use: " + ", ".join(words), "concepts": words}
def reward(prompts, completions, concepts):
    return [float(sum(k in c for k in ks)) for c, ks in zip(completions, concepts)]
LABELS = ("concept", "filler")
'''


def test_eval_prompt_files_go_through_prompt_with_the_training_columns(project):
    write_task(project, PROMPTED)
    (project / "train.jsonl").write_text('{"set": "a#b"}\n{"set": "c#d"}\n')
    (project / "extra.jsonl").write_text('{"set": "dog#park"}\n')
    task = get_task("tasks/mine.py")
    _, splits = task.build(WorldParams(source="train.jsonl", n_train_prompts=1, n_eval_prompts=1), seed=0)
    [row] = task.eval_prompt_rows("extra.jsonl")
    assert row["text"] == "Use: dog, park" and json.loads(row["columns"]) == {"concepts": ["dog", "park"]}
    assert set(row) - {"prompt_id"} == set(splits["eval"][0]) and row["prompt_id"] == "0"
    from pipeline.evaluate.prompts import load_prompt_sets

    sets = load_prompt_sets(["world", "extra.jsonl"], [{**splits["eval"][0], "prompt_id": "e0", "split": "eval"}],
                            None, task.eval_prompt_rows)
    assert sets["extra"] == [row] and json.loads(sets["world"][0]["columns"])["concepts"]


def check(project, text, **changes):
    """test_own_task's check_with on a task that reads its train sets from a small JSONL file."""
    (project / "train.jsonl").write_text('{"set": "a#b"}\n{"set": "c#d"}\n{"set": "e#f"}\n')
    (project / "dexperts.jsonl").write_text('{"prompt": {"text": "Once upon"}}\n')
    world = {"world__source": "train.jsonl", "world__n_train_prompts": 1, "world__n_eval_prompts": 1}
    return check_with(project, text, **{**world, **changes})


def test_drlc_check_refuses_a_reward_the_eval_prompts_cannot_feed(project):
    assert check(project, PROMPTED).returncode == 0
    text = PROMPTED.replace("    words = record", "    if 'prompt' in record:\n        return {'prompt': "
                            "record['prompt']['text']}\n    words = record")
    result = check(project, text, evaluate__prompts=["world", "dexperts.jsonl"])
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Reward reward of tasks/mine.py reads ['concepts']" in result.stderr
    assert "'evaluate.prompts[1]' = 'dexperts.jsonl' lack (their columns: [])" in result.stderr
    defaulted = text.replace("completions, concepts)", "completions, concepts=None)")  # a default: no refusal
    assert check(project, defaulted, evaluate__prompts=["world", "dexperts.jsonl"]).returncode == 0
