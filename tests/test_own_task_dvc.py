"""A task of your own under real DVC: `drlc task new` in a fresh project outside the package, two rounds of
`dvc repro`, then an edit of the reward re-runs score onwards and never rollout."""
import json
import sys

import pytest
import yaml
from e2e import dvc, make_project, run, tiny_params

from pipeline.core import store

pytestmark = pytest.mark.slow


def shrunk(profile: dict, tiny: dict) -> dict:
    """The skeleton's profile with the test's small sizes (tiny_params) for everything but the task's own keys."""
    for section in ("world", "base", "rollout", "evaluate"):
        profile[section].update(tiny[section])
    profile["ppo"].update(mini_batch_size=tiny["ppo"]["mini_batch_size"])
    profile["rounds"] = tiny["rounds"]
    return profile


def test_task_new_runs_two_rounds_and_a_reward_edit_reruns_score_onwards_only(tmp_path):
    project = make_project(tmp_path, tiny_params(n_rounds=2))
    run([sys.executable, "-m", "pipeline", "task", "new", "concepts"], project)
    lines = [line for line in (project / "tasks/concepts.py").read_text().splitlines() if line.strip()]
    assert len(lines) <= 30, len(lines)  # a new task: at most 30 lines of user code, with the skeleton's defaults
    profile = shrunk(yaml.safe_load((project / "configs/concepts.yaml").read_text()), tiny_params(n_rounds=2))
    (project / "params.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    dvc(["repro"], project)

    rollouts = store.read_table(project / "data/rollouts/round=0002", "rollouts")
    scores = store.read_table(project / "data/scores/round=0002", "scores")
    good = {"great", "good", "best", "love", "fun", "funny", "beautiful", "wonderful"}
    for rollout, score in zip(rollouts, scores, strict=True):  # the skeleton's reward, computed here by hand
        words = [w.strip(".,!?;:").lower() for w in rollout["response"].split()]
        assert score["env_reward"] == pytest.approx(min(1.0, 4 * sum(w in good for w in words) / max(len(words), 1)))
    annotations = store.read_table(project / "data/annotations/round=0002", "annotations")
    critiqued = [a for a in annotations if a["critiqued"]]
    assert {a["status"] for a in critiqued} <= {"ok", "none"}  # none: the rule found no span
    assert any(a["status"] == "ok" for a in critiqued) and {a["critic_model"] for a in critiqued} == {"drlc-rules"}
    eval_metrics = json.loads((project / "metrics/eval.json").read_text())
    assert {"env_reward_mean", "perplexity", "dist_2"} <= set(eval_metrics["round=0002"]["world"])
    # a replay runs the rule critic as the stage did (pipeline/steps/critique.py critique_by_rules): the same spans
    replayed = tmp_path / "replayed"
    run([sys.executable, "-m", "pipeline", "replay", "--from", str(project), "--out", str(replayed)], project)
    assert json.loads((replayed / "replay.json").read_text())["critic_requests"] == 0
    drop = ("cache_hit", "attempts")  # how the answer was reached, not what it was
    assert [{k: v for k, v in a.items() if k not in drop}
            for a in store.read_table(replayed / "data/annotations/round=0002", "annotations")] == \
        [{k: v for k, v in a.items() if k not in drop} for a in annotations]

    task_file = project / "tasks/concepts.py"
    task_file.write_text(task_file.read_text().replace("times 4, at most 1", "times 2, at most 1")
                         .replace("min(1.0, 4 *", "min(1.0, 2 *"))
    again = dvc(["repro"], project).stdout
    for stage in ("rollout@0001", "base"):
        assert f"Stage '{stage}' didn't change, skipping" in again, again
    assert "Running stage 'score@0001'" in again and "Running stage 'ppo@0001'" in again
    rescored = store.read_table(project / "data/scores/round=0001", "scores")
    assert {s["scorer_version"] for s in rescored} != {s["scorer_version"] for s in scores}


def test_a_helper_edit_reruns_score_and_critique_and_misses_the_rule_cache_and_other_tasks_files_rerun_nothing(tmp_path):
    """The deps follow the code (pipeline/tasks/_deps.py): a helper module the task file imports is a dep of the
    stages that run the task and part of the rule critic's cache identity; a file of tasks/ that neither the task
    nor its template is (CommonGen's template) is no dep at all."""
    project = make_project(tmp_path, tiny_params(n_rounds=1))
    run([sys.executable, "-m", "pipeline", "task", "new", "concepts"], project)
    (project / "tasks/concepts_words.py").write_text('GOOD = {"great", "good", "best", "love", "fun"}\n')
    task_file = project / "tasks/concepts.py"
    text = task_file.read_text()
    task_file.write_text("from concepts_words import GOOD\n" + text[text.index("RANGE"):].replace(
        text[text.index("GOOD = "):text.index("\n", text.index("GOOD = ")) + 1], ""))
    profile = shrunk(yaml.safe_load((project / "configs/concepts.yaml").read_text()), tiny_params(n_rounds=1))
    (project / "params.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    deps = run([sys.executable, "-m", "pipeline", "task", "deps"], project).stdout
    assert "tasks/concepts_words.py" in deps and "commongen" not in deps, deps
    dvc(["repro"], project)
    first = store.read_table(project / "data/annotations/round=0001", "annotations")
    assert any(a["critiqued"] for a in first)

    (project / "tasks/concepts_words.py").write_text('GOOD = {"great", "good", "best", "love", "fun", "the"}\n')
    again = dvc(["repro"], project).stdout
    assert "Stage 'rollout@0001' didn't change, skipping" in again, again
    assert "Running stage 'score@0001'" in again and "Running stage 'critique@0001'" in again, again
    critiqued = [a for a in store.read_table(project / "data/annotations/round=0001", "annotations") if a["critiqued"]]
    assert critiqued and not any(a["cache_hit"] for a in critiqued)  # the helper is in the rule critic's identity

    (project / "tasks/commongen.md").write_text((project / "tasks/commongen.md").read_text() + "\nedited\n")
    (project / "tasks/commongen.py").write_text("# edited\n")
    status = dvc(["status"], project).stdout
    assert "Data and pipelines are up to date" in status, status


NEW_USERS_TASK = '''"""Two rewards as a new user writes them: one that applies to some prompts only, one async; a helper module."""
import asyncio
from words_helper import GOOD
LABELS = ("good", "bad")


def positive(prompts, completions, bonus):  # None: this reward does not apply to prompts that end in "was"
    return [None if p.rstrip().endswith("was") else bonus * sum(w in GOOD for w in c.lower().split())
            for p, c in zip(prompts, completions)]


async def short(prompts, completions):
    await asyncio.sleep(0)
    return [{"score": 1.0 if len(c.split()) <= 8 else 0.0, "words": len(c.split())} for c in completions]


REWARDS, REWARD_WEIGHTS = [positive, short], [1.0, 0.5]


def critic(query, response):
    return {"good": [w for w in response.split() if w.lower() in GOOD], "bad": []}
'''


def test_a_new_users_task_with_two_rewards_runs_and_a_swept_setting_reruns_score_onwards(tmp_path):
    project = make_project(tmp_path, tiny_params(n_rounds=1))
    run([sys.executable, "-m", "pipeline", "task", "new", "mine"], project)
    (project / "tasks/words_helper.py").write_text('GOOD = {"good", "great", "fun", "best"}\n')
    (project / "tasks/mine.py").write_text(NEW_USERS_TASK)
    profile = shrunk(yaml.safe_load((project / "configs/mine.yaml").read_text()), tiny_params(n_rounds=1))
    profile["score"]["settings"] = {"bonus": 1.0}
    (project / "params.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    run(["git", "add", "-A"], project)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "mine"], project)
    first = dvc(["repro"], project)
    assert "now depend on ['tasks/mine.py', 'tasks/words_helper.py', 'tasks/mine.md']" in first.stderr, first.stderr
    rollouts = {r["rollout_id"]: r for r in store.read_table(project / "data/rollouts/round=0001", "rollouts")}
    for score in store.read_table(project / "data/scores/round=0001", "scores"):  # the total, by hand
        rollout, parts = rollouts[score["rollout_id"]], dict(score["rewards"])
        words = rollout["response"].split()
        good = sum(w in {"good", "great", "fun", "best"} for w in rollout["response"].lower().split())
        positive = None if rollout["query"].rstrip().endswith("was") else float(good)
        short = 1.0 if len(words) <= 8 else 0.0
        assert parts == {"positive": positive, "short": short, "short.words": float(len(words))}
        assert score["env_reward"] == pytest.approx((positive or 0.0) + 0.5 * short)
    logged = json.loads((project / "metrics/score/round=0001.json").read_text())["rewards"]
    assert set(logged) == {"positive", "short", "short.words"} and logged["short"]["applied"] == len(rollouts)

    dvc(["repro"], project)  # once more for the deps the first run wrote into dvc.yaml; then nothing is stale
    assert "Data and pipelines are up to date" in dvc(["status"], project).stdout
    swept = dvc(["exp", "run", "-S", "score.settings.bonus=2.0"], project).stdout
    assert "Stage 'rollout@0001' didn't change, skipping" in swept and "Running stage 'score@0001'" in swept, swept
