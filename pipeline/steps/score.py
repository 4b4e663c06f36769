"""`score` stage: the sparse environment reward of every response."""
from __future__ import annotations

from tqdm import tqdm

from pipeline.rewards.sentiment import VaderReward

SCORE_CHUNK = 256  # responses per scorer call; the progress bar advances per chunk


def score(rollout_rows: list[dict], *, run_id: str, round_: int, scorer: str, scale: float) -> list[dict]:
    """Score each response text with the task's environment reward (sentiment: VADER compound)."""
    reward = VaderReward(scale=scale)
    texts = [row["response"] for row in rollout_rows]
    values = []
    for start in tqdm(range(0, len(texts), SCORE_CHUNK), desc="score", unit="chunk"):
        values += reward.score(texts[start:start + SCORE_CHUNK])
    return [
        {"run_id": run_id, "round": round_, "rollout_id": row["rollout_id"], "env_reward": value,
         "scorer": reward.name, "scorer_version": reward.version}
        for row, value in zip(rollout_rows, values)
    ]
