"""Reward shaping: the one place where the environment reward leaves the task's units.

A reward (built-in or a task file's) returns values in the task's own units: VADER's compound,
1 − toxicity, ROUGE-1 F1 × 100, a task file's weighted total. The scores table stores them as
``env_reward``, and everything that judges a response reads them there: ``critic.threshold``,
the summarization critic's shown score, ``drlc estimate``'s critiqued share, the range check,
the evaluation's ``env_reward_mean``.

What PPO puts on the last token is shaped, in this order (docs/ppo.md, "From the task's reward
to PPO's"):

1. ``score.scale``: times k (here);
2. ``score.normalize``: z-normalised over the round's responses (here);
   stored as the scores table's ``env_reward_shaped``; then, inside the trainer
   (``pipeline.train.ppo.scale_scores``), on every round's batch:
3. ``ppo.use_score_scaling``: divided by the running std over all rounds so far
   (``ppo.use_score_norm``: the running mean subtracted too);
4. ``ppo.score_clip``: clipped to [−clip, clip].
"""
from __future__ import annotations


def population_std(values: list[float]) -> float:
    """The standard deviation of `values` with ddof 0: sqrt(Σ (v − mean)² / n).

    >>> population_std([1.0, 3.0])
    1.0
    """
    mean = sum(values) / len(values)
    return (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5


def z_normalize(values: list[float]) -> list[float]:
    """(x - mean) / std with the population std (ddof 0); all zeros when std is 0 (one value, or all equal).

    >>> z_normalize([1.0, 3.0]), z_normalize([2.0, 2.0])
    ([-1.0, 1.0], [0.0, 0.0])
    """
    mean = sum(values) / len(values)
    std = population_std(values)
    return [(v - mean) / std if std > 0 else 0.0 for v in values]


def shape(env_rewards: list[float], *, scale: float = 1.0, normalize: bool = False) -> list[float]:
    """The round's env rewards as PPO reads them: times `scale` (score.scale), then z-normalised over the round
    when `normalize` (score.normalize). `env_rewards` are in the task's units, one per response of the round.

    >>> shape([1.0, 3.0], scale=10.0), shape([1.0, 3.0], scale=10.0, normalize=True)
    ([10.0, 30.0], [-1.0, 1.0])
    """
    scaled = [scale * value for value in env_rewards]
    return z_normalize(scaled) if normalize and scaled else scaled
