"""`drlc check`: every input any stage of the run reads, checked before any stage runs.

Each stage runs its own share of these checks at its start (pipeline.steps.stage.start); here
they all run at once, so a bad input is refused before DVC deletes any stage's outputs:
the task's params and the critic's inputs (pipeline/steps/preflight.py), the local data files
(pipeline/data/inputs.py), the model folders and GGUF files (pipeline/model/folders.py), the
score model (pipeline/steps/score.py) and the evaluation's classifier data
(pipeline/evaluate/naive_bayes.py). Each raises one DrlcError naming the key, the path and the fix.
"""
from __future__ import annotations

from pathlib import Path

from pipeline.core.config import Params
from pipeline.data.inputs import check_data_files
from pipeline.evaluate.naive_bayes import check_classifier_data
from pipeline.model.folders import check_base_model, check_eval_models
from pipeline.steps.preflight import check_inputs
from pipeline.steps.score import check_score_model
from pipeline.tasks import check_reward_inputs
from pipeline.tasks._deps import sync_task_deps


def check_run_inputs(params: Params, root: str | Path = ".") -> Params:
    """Raise the first DrlcError of any input the run reads; returns params when all are fine. dvc.yaml's deps on
    tasks/ are brought up to date on the way (pipeline/tasks/_deps.py), with one printed line when they change."""
    check_inputs(params, root)
    changed = sync_task_deps(params, root)
    if changed:
        print(changed)
    check_reward_inputs(params)
    if params.rollout.engine == "vllm":  # its module loads torch: drlc check stays quick for every other run
        from pipeline.steps.engine_rollout import check_engine_lengths

        check_engine_lengths(params, root)
    for check in (check_data_files, check_base_model, check_score_model, check_eval_models, check_classifier_data):
        check(params)
    return params
