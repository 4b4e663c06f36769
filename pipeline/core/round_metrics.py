"""Per-round quantities that several stages report: one function each, so one name means one formula.

Every name is documented once in docs/metrics.md. Pure Python over table values (no torch), so
the trainer, the critique step and the curves all call the same code.
"""
from __future__ import annotations


def intrinsic_reward_sum(intrinsic_rewards: list[list[float]]) -> float:
    """Mean over responses of the summed critic (intrinsic) token rewards: (1/B) Σ_b Σ_t intrinsic_{b,t}.

    intrinsic_rewards: one list per response, as the annotations table's ``token_rewards`` column
    (empty for a response the critic did not see).
    Returns 0.0 for no responses.

    >>> intrinsic_reward_sum([[-0.5, 0.5, -0.5], [0.5], []])
    0.0
    >>> intrinsic_reward_sum([[0.5, 0.5], []])
    0.5
    """
    return sum(sum(rewards) for rewards in intrinsic_rewards) / max(len(intrinsic_rewards), 1)
