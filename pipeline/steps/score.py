"""`score` stage: the sparse environment reward of every response (pipeline/rewards/<task>.py).

Each row keeps the reward twice: ``env_reward`` in the task's units, as the reward returned it (what
``critic.threshold``, the critic and the evaluation read), and ``env_reward_shaped``, what PPO puts on
the last token: ``score.scale`` then ``score.normalize`` over the whole round (one PPO rollout batch,
the unit the paper normalised its TL;DR reward-model scores over), in pipeline/rewards/shaping.py.
The chunks below only pace the progress bar, so they never change a value.
"""
from __future__ import annotations

import math
import time

from tqdm import tqdm

from pipeline.core.config import ScoreParams
from pipeline.core.device import holder_device, place, resolve_device
from pipeline.core.errors import DataError, RewardError
from pipeline.rewards.shaping import shape
from pipeline.tasks import get_task

SCORE_CHUNK = 256  # responses per scorer call; the progress bar advances per chunk


def check_score_model(params) -> None:
    """'score.model' of a scorer that reads it (the task's MODEL_SCORERS): a hub id or a model folder with config,
    weights and tokenizer (pipeline/model/folders.py). The score stage and `drlc check` run it at their start."""
    from pipeline.model.folders import check_model_folder

    if params.score.scorer in get_task(params.run.task).MODEL_SCORERS:
        check_model_folder(params.score.model, key="score.model")


def scorer_device(score: ScoreParams, *, task: str, setting: str):
    """Where the scorer's model runs: `setting` (run.device) resolved for a scorer that loads score.model (the
    task's MODEL_SCORERS); None for one without a model (VADER, lexicon, ROUGE, Perspective, fitted), whose
    stage then never imports torch."""
    task_ = get_task(task)  # a task file whose rewards load MODELS runs them there too
    return resolve_device(setting) if score.scorer in task_.MODEL_SCORERS or getattr(task_, "LOADS_MODELS", False) \
        else None


def reward_inputs(reward, prompt_rows: list[dict], rollout_rows: list[dict] | None = None) -> dict:
    """The keyword arguments of reward.score for responses to `prompt_rows` (one prompt row per response):
    references always; queries (the rollouts' or the prompts' texts) and the prompts' columns where the reward
    declares that it reads them (needs_queries, needs_columns)."""
    inputs = {"references": [row.get("reference", "") for row in prompt_rows]}
    if getattr(reward, "needs_queries", False):
        inputs["queries"] = [row["query"] for row in rollout_rows] if rollout_rows else [r["text"] for r in prompt_rows]
    if getattr(reward, "needs_columns", False):
        from pipeline.tasks._from_file import columns_of

        inputs["columns"] = columns_of(prompt_rows)
    return inputs


def reward_origin(reward) -> str:
    """The reward as an error names it: a task file's function and path, or a built-in scorer and its module."""
    task = getattr(reward, "task", None)
    if task is not None:
        return f"reward {reward.name} ({task.path})"
    return f"scorer {reward.name!r} ({type(reward).__module__.replace('.', '/')}.py)"


def check_rewards(values, ids: list[str], *, who: str) -> list[float]:
    """`values` as floats, one per response id of `ids`; raises RewardError naming `who`, the response and the
    value for a count that differs, a value that is not a number, or NaN/inf. Returns the values as floats."""
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__len__"):
        raise RewardError(f"{who} returned {type(values).__name__}, not a list of floats (one per response).")
    if len(values) != len(ids):
        span = f" ({ids[0]} to {ids[-1]})" if ids else ""
        raise RewardError(f"{who} returned {len(values)} values for {len(ids)} responses{span}: "
                          f"return one float per completion, in order.")
    checked = []
    for response_id, value in zip(ids, values):
        number = _as_float(value)
        if number is None or not math.isfinite(number):
            raise RewardError(f"{who} returned {value!r} ({type(value).__name__}) for response {response_id}: "
                              f"return a finite float per completion.")
        checked.append(number)
    return checked


def _as_float(value) -> float | None:
    """A real number (int, float, a NumPy or torch scalar) as float; None for anything else (bool, str, None)."""
    if isinstance(value, (bool, str, bytes)) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def score(rollout_rows: list[dict], prompt_rows: list[dict] | None, *, task: str, run_id: str, round_: int,
          params: ScoreParams, device="cpu", reward=None) -> list[dict]:
    """The rows of `score_round` (without its metrics)."""
    return score_round(rollout_rows, prompt_rows, task=task, run_id=run_id, round_=round_, params=params,
                       device=device, reward=reward)[0]


def score_round(rollout_rows: list[dict], prompt_rows: list[dict] | None, *, task: str, run_id: str, round_: int,
                params: ScoreParams, device="cpu", reward=None, progress: bool = True) -> tuple[list[dict], dict]:
    """Score each response with the task's environment reward, against its prompt's reference.

    A reward with a model (HF classifier, reward model) runs it on `device`. prompt_rows None
    (no prompts table given) scores with empty references, which only the reference-free tasks
    (sentiment, toxicity) accept. reward: the task's reward already built and placed (the chunk
    stage keeps one for all its rounds); None builds it (``get_task(task).make_reward``) on `device`.
    progress: the per-chunk progress bar (off for the in-process study, which scores many small rounds).
    Returns: (score rows (env_reward in the task's units, env_reward_shaped as PPO reads it), metrics: device
    (the reward model's, None for a scorer without one),
    scorer, scorer_heldout (a fitted scorer's held-out agreement with its labels, else None), rows, seconds).
    Raises: DataError if a rollout's prompt_id is not in the prompts table.
    """
    started = time.perf_counter()
    reward = reward if reward is not None else place(get_task(task).make_reward(params), device)
    if prompt_rows is None:
        prompt_rows = [{"prompt_id": row["prompt_id"], "reference": ""} for row in rollout_rows]
    by_id = {row["prompt_id"]: row for row in prompt_rows}
    missing = sorted({row["prompt_id"] for row in rollout_rows} - set(by_id))
    if missing:
        raise DataError(f"Rollouts name prompts {missing[:3]} that the prompts table lacks: re-run prepare and "
                        f"rollout (dvc repro).")
    prompts = [by_id[row["prompt_id"]] for row in rollout_rows]
    texts = [row["response"] for row in rollout_rows]
    values, terms = [], []
    for start in tqdm(range(0, len(texts), SCORE_CHUNK), desc="score", unit="chunk", disable=not progress):
        chunk = slice(start, start + SCORE_CHUNK)
        ids = [row["rollout_id"] for row in rollout_rows[chunk]]
        inputs = reward_inputs(reward, prompts[chunk], rollout_rows[chunk])
        if hasattr(reward, "score_terms"):  # a task file's declared rewards: each one's values beside the total
            totals, parts = reward.score_terms(texts[chunk], ids=ids, queries=inputs["queries"], columns=inputs["columns"])
            terms += parts
        else:
            totals = reward.score(texts[chunk], **inputs)
        values += check_rewards(totals, ids, who=reward_origin(reward))
    shaped = shape(values, scale=params.scale, normalize=params.normalize)
    rows = [
        {"run_id": run_id, "round": round_, "rollout_id": row["rollout_id"], "env_reward": value,
         "env_reward_shaped": value_shaped, "scorer": reward.name, "scorer_version": reward.version}
        for row, value, value_shaped in zip(rollout_rows, values, shaped)
    ]
    if terms:  # the scores table's optional `rewards` map: `drlc sql "SELECT rewards['coverage'] FROM scores"`
        for row, parts in zip(rows, terms):
            row["rewards"] = parts
    return rows, {"device": holder_device(reward), "scorer": reward.name,
                  "scorer_heldout": getattr(reward, "heldout", None), "rows": len(rows),
                  "rewards": reward_means(terms), "seconds": time.perf_counter() - started}


def reward_means(terms: list[dict]) -> dict[str, dict]:
    """{name: {"mean": mean over the responses it applies to, "applied": their count}} of each declared reward.

    >>> reward_means([{"a": 1.0, "b": None}, {"a": 0.0, "b": 2.0}])
    {'a': {'mean': 0.5, 'applied': 2}, 'b': {'mean': 2.0, 'applied': 1}}
    """
    names = list(dict.fromkeys(name for row in terms for name in row))
    means = {}
    for name in names:
        values = [row[name] for row in terms if row.get(name) is not None]
        means[name] = {"mean": sum(values) / len(values) if values else None, "applied": len(values)}
    return means
