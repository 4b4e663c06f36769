"""The task layer: a built-in task module here (pipeline/tasks/<task>.py), or the user's own file.

`run.task` names a built-in module (sentiment, toxicity, summarization) or a task file in the
project's tasks/ folder (``tasks/concepts.py``, or the module ``tasks.concepts``): one reward
function in TRL's convention, everything else optional (pipeline/tasks/_from_file.py, which
presents the file through the interface below; docs/own-task.md walks through one). A task
presents:

- ``SCORERS``: the valid ``score.scorer`` values, the offline one first.
- ``MODEL_SCORERS``: those of SCORERS that read ``score.model`` (checked at load).
- ``DATA_SCORERS``: those of SCORERS fit at load time to ``score.train_data`` (checked at load).
- ``EVAL_NEEDS_REFERENCES``: True when evaluation compares with each prompt's reference,
  which only the world's eval split has (``evaluate.prompts`` must then be [world]).
- ``build(world, *, seed) -> (corpus, {"train": [...], "eval": [...]})``: the pretraining
  corpus of the base model and the prompts of each split, each prompt a dict with ``text``
  and ``reference`` ("" when the task has none), and for a task file ``columns`` (the
  prompt's other fields, JSON). ``world`` is the WorldParams section.
- ``make_reward(score) -> reward``: the environment reward for the ScoreParams section; a
  reward has ``name``, ``version`` and ``score(texts, *, references) -> list[float]``,
  batched, higher is better; a reward with ``needs_queries = True`` is also passed
  ``queries=``, and one with ``needs_columns = True`` ``columns=`` ({field: list}).
- ``reward_range(score) -> (low, high)``: the bounds of make_reward(score)'s rewards, None
  where unbounded (drlc estimate).
- ``critic_fields(row) -> dict``: the critic template's placeholders for one scored rollout
  row (query, response, env_reward).
- ``make_evaluator(evaluate, reward, *, seed) -> evaluator``: `evaluate` is the EvaluateParams
  section and `reward` the built reward; the evaluator's ``metrics(texts_by_prompt, prompts)``
  returns (task metrics, per-sample scores: one list of positive probabilities or Nones, or
  {column: list} for the columns of ``eval_samples``); pipeline/steps/evaluate.py adds the
  reward's mean, perplexity and dist-n.
"""
from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import ModuleType

from pipeline.core.config import TASKS, Params, is_task_file
from pipeline.core.errors import ConfigError


def task_names() -> tuple[str, ...]:
    """The task names: the modules of this package (listed by pipeline.core.config, without importing them)."""
    return TASKS


def get_task(name: str):
    """The task of `run.task`: a built-in module, or a task file's FileTask (read from the working directory, the
    DVC project). Raises ConfigError for an unknown name or a task file that is missing or fails to import."""
    if name in task_names():
        return importlib.import_module(f"pipeline.tasks.{name}")
    if is_task_file(name):  # imported as the built-in task modules are: they all import helpers from this package
        from_file = importlib.import_module("pipeline.tasks._from_file")
        # the DVC project is the working directory; a replay folder's stages run elsewhere and read the checkout's
        root = "." if from_file.task_path(name).is_file() else Path(__file__).resolve().parents[2]
        return from_file.load_task_file(name, root)  # paths relative to the working directory: the DVC project
    raise ConfigError(f"Unknown task {name!r}: use one of {task_names()}, or a task file tasks/<name>.py "
                      f"(drlc task new <name> writes one).")


def task_label(name: str) -> str:
    """The name a critic template's front matter gives the task: a built-in's name, a task file's stem."""
    return Path(name).stem if name.endswith(".py") else name.rsplit(".", 1)[-1] if is_task_file(name) else name


def check_params(params: Params) -> Params:
    """Check what the task module of `run.task` declares: its scorers, which of them read score.model
    or score.train_data, and its eval prompts. Returns params; raises ConfigError naming the key.

    The stages that run the task (prepare, score, critique, evaluate, chunk), `drlc check` and
    `drlc estimate` call it after pipeline.core.config.load_params, which checks types and ranges.
    """
    task = get_task(params.run.task)
    scorer = params.score.scorer
    if os.environ.get("DVC_ROOT"):  # a stage under dvc repro: its deps on tasks/ follow the files it runs
        from pipeline.tasks._deps import sync_task_deps

        changed = sync_task_deps(params, os.environ["DVC_ROOT"])
        if changed:
            print(changed, file=sys.stderr)
    if hasattr(task, "reward_function"):
        task.reward_function(scorer, params.score.settings)  # a task file: its rewards must exist (errors name the file)
    if scorer not in task.SCORERS:
        raise ConfigError(f"'score.scorer' = {scorer!r} is not a scorer of task "
                          f"{params.run.task!r}: use one of {task.SCORERS}.")
    if scorer in task.MODEL_SCORERS and not params.score.model:
        raise ConfigError(f"'score.scorer' = {scorer!r} needs 'score.model' (null now): set it to a local model "
                          f"folder, or use one of {tuple(s for s in task.SCORERS if s not in task.MODEL_SCORERS)}.")
    if scorer in task.DATA_SCORERS and not params.score.train_data:
        raise ConfigError(f"'score.scorer' = {scorer!r} needs 'score.train_data' (null now): set it to "
                          "RealToxicityPrompts JSONL with Perspective scores, e.g. ../shared/data/toxicity/decodingtrust_rtp.")
    if params.world.eval_source and not hasattr(task, "spec"):
        raise ConfigError(f"'world.eval_source' = {params.world.eval_source!r} is read by task files only; task "
                          f"{params.run.task!r} splits 'world.source' itself: set it to null.")
    others = [p for p in params.evaluate.prompts if p != "world"]
    if task.EVAL_NEEDS_REFERENCES and others:
        raise ConfigError(f"'evaluate.prompts' = {params.evaluate.prompts!r}: task {params.run.task!r} evaluates "
                          f"against references, which only the world's eval split has; set it to [world].")
    return params


def prefix_prompt_splits(make_prefixes, world, *, seed: int) -> dict[str, list[dict]]:
    """Train and eval prompts (no reference) from a world's prefix generator.

    `make_prefixes(n, *, seed, min_words, max_words)` as in pipeline/data/world.py; the splits
    use separate seed streams (seed + 1 for train, seed + 2 for eval) so they never overlap by
    construction of the stream.
    """
    return {split: [{"text": text, "reference": ""} for text in make_prefixes(
                n, seed=split_seed, min_words=world.prefix_min_words, max_words=world.prefix_max_words)]
            for split, n, split_seed in (("train", world.n_train_prompts, seed + 1),
                                         ("eval", world.n_eval_prompts, seed + 2))}


def check_reward_inputs(params: Params) -> None:
    """`drlc check`: a task file's rewards get every argument they name from each prompt source (training and
    evaluation prompts alike, both through its prompt()); a built-in task has nothing to check."""
    task = get_task(params.run.task)
    if hasattr(task, "check_reward_inputs"):
        task.check_reward_inputs(params)
