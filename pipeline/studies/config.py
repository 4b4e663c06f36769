"""Study sizes: one frozen dataclass and the presets (smoke, quick, full) of each task."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from pipeline.core.config import BaseParams, PPOParams
from pipeline.core.errors import ConfigError
from pipeline.tasks import task_names

TASKS = task_names()  # every task of pipeline/tasks/ has a study world
PRESETS = ("smoke", "quick", "full")
SCALE_MATCHES = ("mean", "std")


@dataclass(frozen=True)
class StudyConfig:
    """Everything that sizes one task's study; every arm's compute budget is rounds x batch_size rollouts.

    critic_rewards: (label, per-token reward) of each critic span label of the task's template.
    scale_match: how sparse_scaled's k is chosen (analysis.scale_factor): "mean" matches dense_all's
    mean total reward, "std" its within-round spread (for critics that only subtract reward).
    """

    preset: str
    rounds: int
    batch_size: int  # rollouts per round (one response per sampled train prompt)
    seeds: tuple[int, ...]
    task: str = "sentiment"
    world_seed: int = 0
    max_new_tokens: int = 20
    n_reviews: int = 20_000  # pretraining corpus (reviews, comments or documents)
    n_train_prompts: int = 512
    n_eval_prompts: int = 32
    eval_samples_per_prompt: int = 8
    eval_top_p: float = 0.9
    env_classifier_size: int = 4000  # labelled world texts the environment-reward classifier is fit on
    critic_rewards: tuple[tuple[str, float], ...] = (("positive", 0.5), ("negative", -0.5))
    selective_threshold: float = 0.5  # dense_selective critiques responses with env reward <= this
    scale_match: str = "mean"
    final_window: int = 3  # the sparse target = seed-mean env reward over the last final_window rounds
    ablation_rewards: tuple[float, ...] = (0.25, 0.5, 1.0)  # per-token magnitudes, each label keeps its sign
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
        if self.task not in TASKS or self.scale_match not in SCALE_MATCHES:
            raise ConfigError(f"task={self.task!r} / scale_match={self.scale_match!r}: use one of {TASKS} / "
                              f"{SCALE_MATCHES}")

    @property
    def rewards(self) -> dict[str, float]:
        return dict(self.critic_rewards)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


_SMOKE_BASE = dict(vocab_size=320, n_layer=1, n_head=2, n_embd=32, block_size=32, steps=40, batch_size=8)
# The two new worlds follow their demo profiles (configs/demo-<task>.yaml): ppo.learning_rate 1e-4
# (5e-4 wrecked the tiny model there), the demo's critic rewards and thresholds; their base models
# pretrain for 800 steps instead of 1200 to keep the quick study within budget.
_TASK_SETTINGS = {
    "sentiment": {},
    "toxicity": dict(critic_rewards=(("toxic", -0.5),), scale_match="std", max_new_tokens=20,
                     ppo=PPOParams(learning_rate=1e-4, mini_batch_size=16),
                     base=BaseParams(steps=800)),
    "summarization": dict(critic_rewards=(("irrelevant", -0.2), ("incoherent", -0.2), ("factually incorrect", -0.2)),
                          scale_match="std", max_new_tokens=16, ablation_rewards=(0.1, 0.2, 0.4),
                          ppo=PPOParams(learning_rate=1e-4, mini_batch_size=16),
                          base=BaseParams(block_size=128, steps=800)),
}
_QUICK_SIZES = {"sentiment": dict(rounds=16, batch_size=128),
                "toxicity": dict(rounds=12, batch_size=128),
                "summarization": dict(rounds=12, batch_size=128)}


def preset(name: str, task: str = "sentiment") -> StudyConfig:
    """The named preset of `task`: smoke (test, < 1 min), quick (all tasks <= 30 min on 2 idle cores), full.

    Raises: ConfigError for an unknown preset or task.
    """
    if task not in TASKS:
        raise ConfigError(f"unknown study task {task!r}; use one of {TASKS}")
    settings = dict(_TASK_SETTINGS[task])
    if name == "smoke":
        lr = settings.pop("ppo", PPOParams(learning_rate=5e-4)).learning_rate
        block = settings.pop("base", BaseParams()).block_size
        settings.pop("ablation_rewards", None)
        return StudyConfig(
            preset="smoke", task=task, rounds=3, batch_size=16, seeds=(0, 1), n_reviews=600,
            n_train_prompts=64, n_eval_prompts=4, eval_samples_per_prompt=2, env_classifier_size=400,
            final_window=2, ablation_rewards=(0.5, 1.0), ablation_thresholds=(0.5,),
            base=BaseParams(**{**_SMOKE_BASE, "block_size": max(32, block // 2 if block <= 64 else block)}),
            ppo=PPOParams(learning_rate=lr, mini_batch_size=8, ppo_epochs=1),
            **{**settings, "max_new_tokens": 8})
    if name == "quick":
        return StudyConfig(preset="quick", task=task, seeds=(0, 1, 2), **_QUICK_SIZES[task], **settings)
    if name == "full":
        return StudyConfig(preset="full", task=task, rounds=40, batch_size=128, seeds=(0, 1, 2), n_eval_prompts=64,
                           eval_samples_per_prompt=25, final_window=5, **settings)
    raise ConfigError(f"unknown study preset {name!r}; use one of {PRESETS}")
