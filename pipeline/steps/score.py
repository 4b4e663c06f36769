"""`score` stage: the sparse environment reward of every response."""
from __future__ import annotations

from pipeline.rewards.sentiment import VaderReward


def score(rollout_rows: list[dict], *, run_id: str, round_: int, scorer: str, scale: float) -> list[dict]:
    """Score each response text with the task's environment reward (sentiment: VADER compound)."""
    reward = VaderReward(scale=scale)
    values = reward.score([row["response"] for row in rollout_rows])
    return [
        {"run_id": run_id, "round": round_, "rollout_id": row["rollout_id"], "env_reward": value,
         "scorer": reward.name, "scorer_version": reward.version}
        for row, value in zip(rollout_rows, values)
    ]
