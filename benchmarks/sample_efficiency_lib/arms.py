"""The study's arms: what each one changes about the reward PPO sees.

- sparse: the environment reward on the last token only (drlc's critic.enabled: false).
- sparse_scaled: the environment reward times k, with k chosen so that its mean total reward
  equals the dense_all arm's (see analysis.scale_factor): isolates reward *scale* against the
  KL penalty from per-token credit assignment.
- dense_all: critic spans as per-token rewards on every response (threshold = all).
- dense_selective: only responses with P(positive) <= the selective threshold are critiqued.
- dense_zero_mean: dense_all with each critiqued response's token rewards shifted by their mean
  over that response's tokens, so every response's intrinsic rewards sum to zero: only *where*
  the credit goes changes, not how much reward the response gets in total.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

ALL = math.inf  # threshold that critiques every response (env rewards are P(positive) <= 1)


@dataclass(frozen=True)
class Arm:
    """One arm: critic on/off, its threshold, the env-reward scale, and the zero-mean shift."""

    name: str
    critic: bool = False
    threshold: float = ALL
    env_scale: float = 1.0
    zero_mean: bool = False

    def with_scale(self, k: float) -> "Arm":
        return replace(self, env_scale=float(k))

    def describe(self) -> dict:
        return {"critic": self.critic, "threshold": "all" if self.threshold == ALL else self.threshold,
                "env_scale": self.env_scale, "zero_mean": self.zero_mean}


def study_arms(selective_threshold: float) -> dict[str, Arm]:
    """The five arms in run order (sparse_scaled's k is filled in once sparse and dense_all ran)."""
    return {
        "sparse": Arm("sparse"),
        "dense_all": Arm("dense_all", critic=True),
        "dense_selective": Arm("dense_selective", critic=True, threshold=selective_threshold),
        "dense_zero_mean": Arm("dense_zero_mean", critic=True, zero_mean=True),
        "sparse_scaled": Arm("sparse_scaled"),
    }
