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

    task_file = project / "tasks/concepts.py"
    task_file.write_text(task_file.read_text().replace("times 4, at most 1", "times 2, at most 1")
                         .replace("min(1.0, 4 *", "min(1.0, 2 *"))
    again = dvc(["repro"], project).stdout
    for stage in ("rollout@0001", "base"):
        assert f"Stage '{stage}' didn't change, skipping" in again, again
    assert "Running stage 'score@0001'" in again and "Running stage 'ppo@0001'" in again
    rescored = store.read_table(project / "data/scores/round=0001", "scores")
    assert {s["scorer_version"] for s in rescored} != {s["scorer_version"] for s in scores}
