"""Study sizes: one frozen dataclass and the three presets (smoke, quick, full)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from pipeline.config import BaseParams, PPOParams
from pipeline.errors import ConfigError


@dataclass(frozen=True)
class StudyConfig:
    """Everything that sizes the study; the compute budget of every arm is rounds x batch_size rollouts."""

    preset: str
    rounds: int
    batch_size: int  # rollouts per round (one response per sampled train prompt)
    seeds: tuple[int, ...]
    world_seed: int = 0
    max_new_tokens: int = 20
    n_reviews: int = 20_000  # pretraining corpus
    n_train_prompts: int = 512
    n_eval_prompts: int = 32
    eval_samples_per_prompt: int = 8
    eval_top_p: float = 0.9
    env_classifier_size: int = 4000  # labelled world reviews the environment-reward classifier is fit on
    critic_rewards: tuple[float, float] = (0.5, -0.5)  # positive, negative span reward per token
    selective_threshold: float = 0.5  # dense_selective critiques responses with P(positive) <= this
    final_window: int = 3  # the sparse target = seed-mean env reward over the last final_window rounds
    ablation_rewards: tuple[float, ...] = (0.25, 0.5, 1.0)
    ablation_thresholds: tuple[float, ...] = (0.5, 0.2)
    base: BaseParams = field(default_factory=BaseParams)
    ppo: PPOParams = field(default_factory=lambda: PPOParams(learning_rate=5e-4, mini_batch_size=16))

    def __post_init__(self):
        if self.rounds < 2 or self.batch_size < 1 or not self.seeds:
            raise ConfigError(f"study needs rounds >= 2, batch_size >= 1 and a seed, got rounds={self.rounds}, "
                              f"batch_size={self.batch_size}, seeds={self.seeds}; use a preset")
        if self.batch_size % self.ppo.backward_batch_size:
            raise ConfigError(f"batch_size={self.batch_size} must be a multiple of ppo.mini_batch_size="
                              f"{self.ppo.mini_batch_size}; change one of them")
        if not 1 <= self.final_window <= self.rounds:
            raise ConfigError(f"final_window={self.final_window} must be in [1, rounds={self.rounds}]")

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def preset(name: str) -> StudyConfig:
    """The named preset: smoke (test, ~1 min), quick (<= 30 min on 2 idle cores), full (the study)."""
    if name == "smoke":
        return StudyConfig(
            preset="smoke", rounds=3, batch_size=16, seeds=(0, 1), max_new_tokens=8, n_reviews=600,
            n_train_prompts=64, n_eval_prompts=4, eval_samples_per_prompt=2, env_classifier_size=400,
            final_window=2, ablation_rewards=(0.5, 1.0), ablation_thresholds=(0.5,),
            base=BaseParams(vocab_size=320, n_layer=1, n_head=2, n_embd=32, block_size=32, steps=40,
                            batch_size=8),
            ppo=PPOParams(learning_rate=5e-4, mini_batch_size=8, ppo_epochs=1),
        )
    if name == "quick":
        return StudyConfig(preset="quick", rounds=16, batch_size=128, seeds=(0, 1, 2))
    if name == "full":
        return StudyConfig(preset="full", rounds=40, batch_size=128, seeds=(0, 1, 2), n_eval_prompts=64,
                           eval_samples_per_prompt=25, final_window=5)
    raise ConfigError(f"unknown study preset {name!r}; use smoke, quick or full")
