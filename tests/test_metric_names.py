"""The metric names the code logs are exactly the ones docs/metrics.md defines, place by place."""
import re
from pathlib import Path

import pytest
import torch
from test_evaluate_curves import build
from test_trainer import frozen_copy, rollout, tiny_policy, toy_params

from pipeline.core.store import SCHEMAS
from pipeline.evaluate.curves import round_curves
from pipeline.steps.ppo_round import step_row, summarize
from pipeline.train.ppo import AdaptiveKLController, RunningMoments
from pipeline.train.trainer import make_optimizer, train_round

DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"


def documented() -> dict[str, set[str]]:
    """{place: names} from the table of docs/metrics.md (one row per name; last column = places)."""
    places: dict[str, set[str]] = {}
    for name, where in re.findall(r"^\| `([\w<>]+)` \|.*\| ([^|]+) \|$", DOC.read_text(), flags=re.M):
        for place in where.split(","):
            places.setdefault(place.strip(), set()).add(name)
    return places


def test_each_name_is_documented_once():
    names = re.findall(r"^\| `([\w<>]+)` \|", DOC.read_text(), flags=re.M)
    assert len(names) == len(set(names)) > 25


@pytest.fixture(scope="module")
def trainer_stats():
    torch.manual_seed(0)
    policy = tiny_policy()
    params = toy_params(ppo_epochs=1)
    steps = train_round(policy=policy, ref_model=frozen_copy(policy), optimizer=make_optimizer(policy, 1e-3),
                        batch=rollout(policy, seed=0), params=params, seed=0, progress=False,
                        kl_controller=AdaptiveKLController(params.init_kl_coef, params.target, params.horizon),
                        score_moments=RunningMoments())
    return steps


def test_trainer_stats_and_ppo_steps_columns_are_the_documented_trainer_names(trainer_stats):
    expected = documented()["trainer"]
    assert all(set(stats) == expected for stats in trainer_stats)
    assert set(SCHEMAS["ppo_steps"].names) - {"run_id", "round", "step"} == expected
    row = step_row(trainer_stats[0], run_id="t", round_=1, step=0)
    assert set(row) == set(SCHEMAS["ppo_steps"].names)


def test_ppo_round_json_keys_are_documented(trainer_stats):
    rows = [step_row(s, run_id="t", round_=1, step=i) for i, s in enumerate(trainer_stats)]
    assert set(summarize(rows)) == documented()["ppo json"]


def test_rounds_json_keys_are_documented(tmp_path):
    curves = round_curves(build(tmp_path))
    assert all(set(c) - {"round"} == documented()["rounds"] for c in curves)


def test_dvc_plots_read_documented_rounds_names():
    import yaml

    plots = yaml.safe_load((DOC.parents[1] / "dvc.yaml").read_text())["plots"]
    plotted = {y for plot in plots for spec in plot.values() for ys in spec["y"].values() for y in ys}
    assert plotted <= documented()["rounds"], plotted - documented()["rounds"]


def test_score_stage_json_keys_are_documented():
    from pipeline.core.config import ScoreParams
    from pipeline.steps.score import score_round

    rows = [{"rollout_id": "r0", "prompt_id": 0, "query": "", "response": "a fine day"}]
    _, metrics = score_round(rows, None, task="sentiment", run_id="t", round_=1, params=ScoreParams())
    assert set(metrics) <= documented()["stage json"], set(metrics) - documented()["stage json"]
