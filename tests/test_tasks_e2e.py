"""Each task's offline demo profile end to end on a shrunken config: real DVC, real HTTP critic,
real tiny GPT-2. The environment reward of the last round beats the first round's by a margin, and
the final policy stays close to the base model (KL and perplexity bounds).

Run time on 2 shared CPU cores: toxicity about 90 s (3 rounds of 32 rollouts), summarization
about 140 s (3 rounds of 64 rollouts).
"""
import json

import pyarrow.parquet as pq
import pytest
from e2e import dvc, make_project, tiny_params

pytestmark = pytest.mark.slow  # every test here runs `dvc repro` (or uses a fixture that does)

TASK_METRICS = {"toxicity": {"expected_max_toxicity", "toxicity_probability"},
                "summarization": {"rouge1", "rouge2", "rougeL"}}


@pytest.fixture(scope="module", params=["toxicity", "summarization"])
def finished_run(request, tmp_path_factory):
    task = request.param
    project = make_project(tmp_path_factory.mktemp(task), tiny_params(n_rounds=3, task=task))
    dvc(["repro"], project)
    return task, project


# (first-round mean + margin) the last round must reach. Standard error of a round mean: about 0.045
# (summarization, 64 rollouts, reward sd 0.35) and 0.07 (toxicity, 32 rollouts, sd 0.41).
# Measured: summarization 0.591, 0.714, 0.803; toxicity 0.667, 0.779, 0.848.
REWARD_MARGIN = {"toxicity": 0.12, "summarization": 0.12}
MAX_ROUND_KL = 3.0  # nats summed over a response; measured at most 0.14 (toxicity), 0.38 (summarization)


def test_reward_rises(finished_run):
    task, project = finished_run
    curves = json.loads((project / "metrics" / "rounds.json").read_text())["rounds"]
    rewards = [c["env_reward_mean"] for c in curves]
    assert rewards[-1] > rewards[0] + REWARD_MARGIN[task], rewards
    metrics = json.loads((project / "metrics" / "eval.json").read_text())
    base, final = metrics["base"]["world"], metrics["round=0003"]["world"]
    assert final["env_reward_mean"] > base["env_reward_mean"], (base, final)


def test_policy_stays_fluent(finished_run):
    """No reward hacking by degenerate text: the KL to the base and the perplexity stay small."""
    task, project = finished_run
    curves = json.loads((project / "metrics" / "rounds.json").read_text())["rounds"]
    assert all(c["kl"] < MAX_ROUND_KL for c in curves), [c["kl"] for c in curves]
    metrics = json.loads((project / "metrics" / "eval.json").read_text())
    base, final = metrics["base"]["world"], metrics["round=0003"]["world"]
    assert final["perplexity"] < 2 * base["perplexity"], (base["perplexity"], final["perplexity"])


def test_critic_is_called_and_task_metrics_are_written(finished_run):
    task, project = finished_run
    curves = json.loads((project / "metrics" / "rounds.json").read_text())["rounds"]
    assert sum(c["critiqued"] for c in curves) > 0
    metrics = json.loads((project / "metrics" / "eval.json").read_text())
    for by_set in metrics.values():
        assert TASK_METRICS[task] <= set(by_set["world"]), by_set


def test_rows_carry_the_task(finished_run):
    task, project = finished_run
    prompts = pq.read_table(project / "data" / "prompts" / "round=0000" / "part-0.parquet").to_pylist()
    scores = pq.read_table(project / "data" / "scores" / "round=0001" / "part-0.parquet").to_pylist()
    assert {s["scorer"] for s in scores} == {"lexicon" if task == "toxicity" else "rouge1"}
    assert all(p["reference"] for p in prompts) == (task == "summarization")
    annotations = pq.read_table(project / "data" / "annotations" / "round=0001" / "part-0.parquet").to_pylist()
    critiqued = [a for a in annotations if a["critiqued"]]
    assert critiqued and all(a["status"] in ("ok", "none") for a in critiqued), critiqued[:2]
    assert any(a["status"] == "ok" for a in critiqued)
