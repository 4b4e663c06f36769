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
- grpo_sparse: GRPO (ppo.algorithm grpo, no value head) on the environment reward alone: G = 4 responses
  to each of batch_size / 4 prompts, so the round holds the same batch_size rollouts as a PPO arm
  (and the same minibatches and optimizer steps); the critic is off and ppo.dense_weight is 0.
- grpo_dense: grpo_sparse plus the critic's spans on every response (threshold = all), as GRPO's
  per-token term with ppo.dense_weight 1 (docs/algorithms.md).
Both GRPO arms use configs/demo-grpo.yaml's KL: a fixed β = 0.04 as TRL's k3 loss term (DeepSeekMath's),
where the PPO arms keep their adaptive KL penalty in the reward; matched-KL comparisons put them side by side.

The one arm table: the in-process study (runner) and the DVC form
(benchmarks/sample_efficiency_dvc.py, via :meth:`Arm.dvc_settings`) both read :func:`study_arms`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from pipeline.core.config import CriticParams, PPOParams

ALL = 1.0e9  # threshold that critiques every response: above any env reward, and finite so params.yaml holds it
GROUP = 4  # the GRPO arms' responses per prompt (configs/demo-grpo.yaml's rollout.samples_per_prompt)
GRPO_PPO = {"vf_coef": 0.0, "adap_kl_ctrl": False, "init_kl_coef": 0.04}  # value-free, a fixed beta (demo-grpo)
GRPO_ARMS = ("grpo_sparse", "grpo_dense")


@dataclass(frozen=True)
class Arm:
    """One arm: critic on/off, its threshold, the env-reward scale, the zero-mean shift, and the update.

    algorithm "ppo" keeps the study's PPO settings; "grpo" samples `samples_per_prompt` responses per
    prompt (the round's rollouts stay config.batch_size) and trains with GRPO_PPO and `dense_weight`.
    """

    name: str
    critic: bool = False
    threshold: float = ALL
    env_scale: float = 1.0
    zero_mean: bool = False
    algorithm: str = "ppo"
    samples_per_prompt: int = 1
    dense_weight: float = 0.0

    def with_scale(self, k: float) -> "Arm":
        return replace(self, env_scale=float(k))

    def critic_params(self, *, rewards: dict[str, float], alignment: str = "exact",
                      threshold: float | None = None) -> CriticParams:
        """The critique stage's settings of this arm (threshold overrides the arm's); no failure is tolerated."""
        return CriticParams(threshold=self.threshold if threshold is None else threshold, rewards=dict(rewards),
                            alignment=alignment, zero_mean=self.zero_mean, max_error_rate=0.0)

    def ppo_params(self, study: PPOParams) -> PPOParams:
        """The update's settings: the study's PPO ones, or for GRPO those plus GRPO_PPO and the dense weight."""
        if self.algorithm == "ppo":
            return study
        return replace(study, algorithm=self.algorithm, dense_weight=self.dense_weight, **GRPO_PPO)

    def dvc_settings(self) -> dict:
        """The params.yaml keys this arm sets in a DVC experiment (all of them, so no arm inherits another's;
        a GRPO arm also sets GRPO_PPO's keys, a PPO arm keeps the project's)."""
        settings = {"critic.enabled": self.critic, "critic.threshold": self.threshold,
                    "critic.zero_mean": self.zero_mean, "score.scale": self.env_scale,
                    "ppo.algorithm": self.algorithm, "rollout.samples_per_prompt": self.samples_per_prompt}
        if self.algorithm != "ppo":
            settings.update({"ppo.dense_weight": self.dense_weight, **{f"ppo.{k}": v for k, v in GRPO_PPO.items()}})
        return settings

    def describe(self) -> dict:
        return {"critic": self.critic, "threshold": "all" if self.threshold == ALL else self.threshold,
                "env_scale": self.env_scale, "zero_mean": self.zero_mean, "algorithm": self.algorithm,
                "samples_per_prompt": self.samples_per_prompt, "dense_weight": self.dense_weight}


def study_arms(selective_threshold: float) -> dict[str, Arm]:
    """The seven arms in run order (sparse_scaled's k is filled in once sparse and dense_all ran)."""
    return {
        "sparse": Arm("sparse"),
        "dense_all": Arm("dense_all", critic=True),
        "dense_selective": Arm("dense_selective", critic=True, threshold=selective_threshold),
        "dense_zero_mean": Arm("dense_zero_mean", critic=True, zero_mean=True),
        "sparse_scaled": Arm("sparse_scaled"),
        "grpo_sparse": Arm("grpo_sparse", algorithm="grpo", samples_per_prompt=GROUP),
        "grpo_dense": Arm("grpo_dense", critic=True, algorithm="grpo", samples_per_prompt=GROUP, dense_weight=1.0),
    }
