"""The real-text study's arms (issue 30): which critic a dense arm uses, and which algorithm trains it.

The question: on real text, how good must the critic be for its per-token rewards to pay off? Each
dense arm uses one critic of measured quality (char F1 on the SemEval-2021 trial posts, from
`drlc critic eval`); the controls are sparse PPO, sparse PPO with the env reward scaled by k
(the scale-matched control, k matched to the tagger arm, :func:`analysis.scale_factor`), and the
random-span critic (the tagger's span count and lengths at random places: any dense signal, not
the right tokens).

An arm's name is ``<reward arm>`` for PPO and ``<reward arm>-<algorithm>`` for a value-free one
(``dense_tagger-grpo``). Every arm sets every key it touches (critic.*, score.scale, the
algorithm's keys), so no arm inherits another's; the rest comes from the study profile
(configs/study-detox.yaml); benchmarks/sample_efficiency_dvc.py runs them.
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.core.errors import ConfigError

ALL = 1.0e9  # a threshold that critiques every response: above any env reward, finite so params.yaml holds it

TAGGER_DIR = "critics/semeval"  # written by the study profile's distill@semeval stage


@dataclass(frozen=True)
class Critic:
    """One critic of the study: the critic.* keys that select it, and where its char F1 was measured."""

    name: str
    backend: str
    model: str
    model_dir: str | None = None
    answer_format: str = "text"
    seeded: bool = False  # the random-span control: critic.extra_body.drlc_seed = the run's seed
    quality_source: str = ""  # the result JSON (and key) holding its char F1 on the SemEval trial posts

    def settings(self, seed: int) -> dict:
        return {"critic.enabled": True, "critic.endpoint": "local", "critic.backend": self.backend,
                "critic.model": self.model, "critic.model_dir": self.model_dir,
                "critic.answer_format": self.answer_format,
                "critic.extra_body": {"drlc_seed": int(seed)} if self.seeded else {}}


CRITICS = {c.name: c for c in (
    Critic("tagger", "tagger", "drlc-tagger", TAGGER_DIR,
           quality_source="study_critics.json: critics.tagger (tagger.json: semeval.trial_audit.configured)"),
    Critic("random", "random_spans", "drlc-random-spans", TAGGER_DIR, seeded=True,
           quality_source="study_critics.json: critics.random"),
    Critic("lexicon", "lexicon", "drlc-lexicon",
           quality_source="study_critics.json: critics.lexicon (tagger.json: semeval.trial_audit.lexicon)"),
    Critic("smol_copy", "hf", "smollm2-135m-instruct", "base", answer_format="copy",
           quality_source="critic_formats.json: results[answer_format=copy] (40 posts)"),
    Critic("smol_text", "hf", "smollm2-135m-instruct", "base", answer_format="text",
           quality_source="critic_formats.json: results[answer_format=text] (40 posts)"),
)}
SPARSE = {"critic.enabled": False, "critic.threshold": ALL, "critic.zero_mean": False}
ALGORITHMS = {  # the keys each algorithm needs; same rollout.batch_size (rollouts per round) for all
    "ppo": {"ppo.algorithm": "ppo", "rollout.samples_per_prompt": 1, "ppo.vf_coef": 0.1},
    "grpo": {"ppo.algorithm": "grpo", "rollout.samples_per_prompt": 4, "ppo.vf_coef": 0.0},
    "rloo": {"ppo.algorithm": "rloo", "rollout.samples_per_prompt": 4, "ppo.vf_coef": 0.0},
    "reinforce_pp": {"ppo.algorithm": "reinforce_pp", "rollout.samples_per_prompt": 1, "ppo.vf_coef": 0.0},
}
SCALE_REFERENCE = "dense_tagger"  # sparse_scaled's k matches this arm's reward spread
RANDOM_CONTROL = "dense_random"  # "any dense signal": with --main-seeds it gets the best critic's seeds


def reward_arms() -> tuple[str, ...]:
    """sparse, sparse_scaled and one dense arm per critic, in run order."""
    return ("sparse", "sparse_scaled", *(f"dense_{name}" for name in CRITICS))


def arm_name(reward_arm: str, algorithm: str = "ppo") -> str:
    return reward_arm if algorithm == "ppo" else f"{reward_arm}-{algorithm}"


def split_name(arm: str) -> tuple[str, str]:
    """(reward arm, algorithm) of a study arm's name.

    :raises ConfigError: an unknown reward arm or algorithm, naming the valid ones
    """
    reward_arm, _, algorithm = arm.partition("-")
    algorithm = algorithm or "ppo"
    if reward_arm not in reward_arms() or algorithm not in ALGORITHMS:
        raise ConfigError(f"unknown real-text arm {arm!r}; valid: <{' | '.join(reward_arms())}>"
                          f"[-{' | -'.join(a for a in ALGORITHMS if a != 'ppo')}]")
    return reward_arm, algorithm


def study_arms(critics: list[str], algorithms: list[str], value_free_critics: list[str] | None = None) -> list[str]:
    """The arms of a real-text run, in run order: per algorithm sparse, the dense arm of each critic,
    then (PPO only) sparse_scaled, whose k needs sparse and the scale reference first.

    value_free_critics: the critics with a dense arm under the value-free algorithms (default: ``critics``),
    so a study can run every critic under PPO and only the best one and its random control under GRPO.
    :raises ConfigError: an unknown critic or algorithm
    """
    value_free = critics if value_free_critics is None else value_free_critics
    unknown = [c for c in (*critics, *value_free) if c not in CRITICS] + [a for a in algorithms if a not in ALGORITHMS]
    if unknown:
        raise ConfigError(f"unknown critics/algorithms {unknown}; critics: {list(CRITICS)}, algorithms: "
                          f"{list(ALGORITHMS)}")
    arms = [arm_name(r, a) for a in algorithms
            for r in ("sparse", *(f"dense_{c}" for c in (critics if a == "ppo" else value_free)))]
    return arms + (["sparse_scaled"] if "ppo" in algorithms else [])


def control(arm: str) -> str:
    """The arm a study arm's gain is measured against: sparse_scaled under PPO, the plain sparse arm of the
    same algorithm under a value-free one (its group normalisation cancels any scale, :func:`settings`)."""
    algorithm = split_name(arm)[1]
    return "sparse_scaled" if algorithm == "ppo" else arm_name("sparse", algorithm)


def settings(arm: str, *, seed: int, k: float | str | None = None) -> dict:
    """Every params key `arm` sets in a DVC experiment of run seed `seed`.

    k: sparse_scaled's env-reward scale (a string, the dry run's "<k>", is written as it is).
    Under a value-free algorithm the scale-matched control is the plain sparse arm: GRPO and RLOO
    normalise the outcome within each group, so k cancels; ask for ``sparse-grpo`` instead.
    :raises ConfigError: an unknown arm, sparse_scaled without k, or sparse_scaled with a value-free algorithm
    """
    reward_arm, algorithm = split_name(arm)
    out = dict(ALGORITHMS[algorithm])
    if reward_arm.startswith("dense_"):
        critic = CRITICS[reward_arm.removeprefix("dense_")]
        return out | {**critic.settings(seed), "critic.threshold": ALL, "critic.zero_mean": False, "score.scale": 1.0}
    if reward_arm == "sparse_scaled" and algorithm != "ppo":
        raise ConfigError(f"{arm}: {algorithm} normalises the env reward per group, so a scaled sparse arm equals "
                          f"sparse-{algorithm}; run sparse-{algorithm} and dense_random-{algorithm} as its controls")
    if reward_arm == "sparse_scaled" and k is None:
        raise ConfigError(f"sparse_scaled needs k: run sparse and {SCALE_REFERENCE} first")
    scale = 1.0 if reward_arm == "sparse" else (k if isinstance(k, str) else float(k))
    return out | SPARSE | {"score.scale": scale}
