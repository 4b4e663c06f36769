"""`score` stage: the sparse environment reward of every response (pipeline/rewards/<task>.py)."""
from __future__ import annotations

from tqdm import tqdm

from pipeline.config import ScoreParams
from pipeline.errors import DataError
from pipeline.tasks import get_task

SCORE_CHUNK = 256  # responses per scorer call; the progress bar advances per chunk


def score(rollout_rows: list[dict], prompt_rows: list[dict] | None, *, task: str, run_id: str, round_: int,
          params: ScoreParams) -> list[dict]:
    """Score each response with the task's environment reward, against its prompt's reference.

    prompt_rows None (no prompts table given) scores with empty references, which only the
    reference-free tasks (sentiment, toxicity) accept.
    Raises: DataError if a rollout's prompt_id is not in the prompts table.
    """
    reward = get_task(task).make_reward(params)
    if prompt_rows is None:
        prompt_rows = [{"prompt_id": row["prompt_id"], "reference": ""} for row in rollout_rows]
    references = {row["prompt_id"]: row["reference"] for row in prompt_rows}
    missing = sorted({row["prompt_id"] for row in rollout_rows} - set(references))
    if missing:
        raise DataError(f"Rollouts name prompts {missing[:3]} that the prompts table lacks: re-run prepare and "
                        f"rollout (dvc repro).")
    texts = [row["response"] for row in rollout_rows]
    refs = [references[row["prompt_id"]] for row in rollout_rows]
    values = []
    for start in tqdm(range(0, len(texts), SCORE_CHUNK), desc="score", unit="chunk"):
        values += reward.score(texts[start:start + SCORE_CHUNK], references=refs[start:start + SCORE_CHUNK])
    return [
        {"run_id": run_id, "round": round_, "rollout_id": row["rollout_id"], "env_reward": value,
         "scorer": reward.name, "scorer_version": reward.version}
        for row, value in zip(rollout_rows, values)
    ]
