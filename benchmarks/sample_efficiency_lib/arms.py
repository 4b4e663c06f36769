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

The one arm table: the in-process study (runner) and the DVC form
(benchmarks/sample_efficiency_dvc.py, via :meth:`Arm.dvc_settings`) both read :func:`study_arms`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from pipeline.core.config import CriticParams

ALL = 1.0e9  # threshold that critiques every response: above any env reward, and finite so params.yaml holds it


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

    def critic_params(self, *, rewards: dict[str, float], alignment: str = "exact",
                      threshold: float | None = None) -> CriticParams:
        """The critique stage's settings of this arm (threshold overrides the arm's); no failure is tolerated."""
        return CriticParams(threshold=self.threshold if threshold is None else threshold, rewards=dict(rewards),
                            alignment=alignment, zero_mean=self.zero_mean, max_error_rate=0.0)

    def dvc_settings(self) -> dict:
        """The params.yaml keys this arm sets in a DVC experiment (all of them, so no arm inherits another's)."""
        return {"critic.enabled": self.critic, "critic.threshold": self.threshold,
                "critic.zero_mean": self.zero_mean, "score.scale": self.env_scale}

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
