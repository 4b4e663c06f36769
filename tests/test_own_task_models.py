"""A reward that needs a model (pipeline/tasks/_rewards.py MODELS): the file names a loader, drlc calls it once
per stage on run.device, the first time a reward that names the model scores, and never at import."""
import pytest
import torch

from pipeline.core.config import ScoreParams
from pipeline.core.errors import RewardError
from pipeline.steps.score import score_round, scorer_device
from pipeline.tasks import get_task
from test_own_task import project, prompt_rows, rollout_rows, write_task  # noqa: F401 (the fixture)

JUDGE = '''LOADS = []
def load_judge(device):  # nothing heavy at import: torch is imported here, when a stage scores
    import torch
    LOADS.append(str(device))
    torch.manual_seed(0)
    return torch.nn.Linear(1, 1).to(device)
def judged(prompts, completions, judge):
    import torch
    with torch.no_grad():
        return [float(judge(torch.tensor([[float(len(c.split()))]]))) for c in completions]
def plain(prompts, completions):
    return [1.0] * len(completions)
REWARDS = [judged, plain]
MODELS = {"judge": load_judge}
'''


def test_the_model_loads_once_per_stage_on_its_device_and_never_at_import(project):
    spec = write_task(project, JUDGE)
    task = get_task(spec)
    reward = task.make_reward(ScoreParams(scorer="reward"))
    assert task.module.LOADS == [] and reward.device is None  # imported and built: nothing loaded
    device = scorer_device(ScoreParams(scorer="reward"), task=spec, setting="cpu")
    assert device == torch.device("cpu")
    rows, metrics = score_round(rollout_rows(4), prompt_rows(), task=spec, run_id="t", round_=1,
                                params=ScoreParams(scorer="reward"), reward=reward.to(device))
    score_round(rollout_rows(4, round_=2), prompt_rows(), task=spec, run_id="t", round_=2,
                params=ScoreParams(scorer="reward"), reward=reward)
    assert task.module.LOADS == ["cpu"] and metrics["device"] == "cpu"
    torch.manual_seed(0)
    linear = torch.nn.Linear(1, 1)  # the loader's model, built here the same way, scores the word counts
    with torch.no_grad():
        expected = [float(linear(torch.tensor([[n]]))) + 1.0 for n in (1.0, 2.0, 3.0, 1.0)]
    assert [r["env_reward"] for r in rows] == pytest.approx(expected)


def test_a_file_without_models_runs_its_scorer_on_no_device(project):
    spec = write_task(project)
    assert scorer_device(ScoreParams(scorer="reward"), task=spec, setting="cpu") is None


def test_a_loader_that_fails_is_one_error_naming_the_file_and_line(project):
    spec = write_task(project, JUDGE.replace("    LOADS.append(str(device))", "    raise OSError('no weights')"))
    with pytest.raises(RewardError, match=r"MODELS\['judge'\] of tasks/mine.py failed to load at .*mine.py line 4: "
                                          r"OSError: no weights"):
        score_round(rollout_rows(2), prompt_rows(), task=spec, run_id="t", round_=1, params=ScoreParams(scorer="reward"))
