"""Zero-cost ablation: replay recorded rollouts under other critic settings, with no critic call.

The idea of drlc's pipeline/commands/replay.py, in-process: a fresh policy from the base model is
trained, round by round, on the rollouts the dense_all arm recorded (its env rewards and
behaviour log-probs), with the intrinsic rewards rebuilt from the cached critic answers under
the new setting (reward per label, alignment mode, a threshold). The replay critic refuses every
cache miss, and the study asserts that it made no call. Because dense_all critiqued every
response, any threshold can be replayed. Each replayed policy is then evaluated like an arm.
Replayed updates are off-policy after the first round (the rollouts came from the dense_all
policy), so compare the settings with each other, not with the live arms.
"""
from __future__ import annotations

import math
import time

import torch

from pipeline.core.seeding import round_seed
from pipeline.model.policy import frozen_copy, load_policy
from pipeline.steps.ppo_round import new_kl_controller
from pipeline.studies.arms import ALL, Arm
from pipeline.studies.runner import annotate_arm, evaluate_policy, ppo_batch
from pipeline.train.ppo import RunningMoments
from pipeline.train.trainer import make_optimizer, train_round


def ablation_settings(cfg) -> list[dict]:
    """The replayed settings: reward magnitudes, substring alignment, thresholds, and no critic at all.

    A magnitude m gives every span label the per-token reward m with the sign of its study reward.
    """
    base = {"rewards": cfg.rewards, "alignment": "exact", "threshold": ALL, "critic": True}
    settings = [dict(base, name=f"rewards_{m:g}", rewards={label: math.copysign(m, v) for label, v in cfg.rewards.items()})
                for m in cfg.ablation_rewards]
    settings.append(dict(base, name="alignment_substring", alignment="substring"))
    settings += [dict(base, name=f"threshold_{t:g}", threshold=t) for t in cfg.ablation_thresholds]
    settings.append(dict(base, name="no_critic", critic=False))
    return settings


def replay_setting(setting: dict, recorded: list[list[dict]], ctx, *, seed: int) -> dict:
    """Train a fresh policy on the recorded rounds under `setting`; return its eval metrics and reward totals."""
    started, cfg = time.perf_counter(), ctx.config
    torch.manual_seed(seed)
    policy, tokenizer = load_policy(ctx.base_dir, seed=seed)
    reference = frozen_copy(policy)
    optimizer, kl_controller, moments = make_optimizer(policy, cfg.ppo.learning_rate), new_kl_controller(cfg.ppo), RunningMoments()
    arm = Arm(setting["name"], critic=setting["critic"], threshold=setting["threshold"])
    rewards = setting["rewards"]
    ctx.critic.arm = f"ablation/{setting['name']}"
    intrinsic_totals, critiqued = [], 0
    for round_, rows in enumerate(recorded, start=1):
        annotated = annotate_arm(rows, arm, ctx, tokenizer, rewards=rewards, alignment=setting["alignment"])
        critiqued += sum(a["critiqued"] for a in annotated)
        intrinsic_totals += [sum(a["token_rewards"]) for a in annotated]
        train_round(policy=policy, ref_model=reference, optimizer=optimizer, batch=ppo_batch(rows, annotated),
                    params=cfg.ppo,
                    kl_controller=kl_controller, score_moments=moments, seed=round_seed(seed, round_, 4), progress=False)
    return {"setting": {k: ("all" if v == ALL else v) for k, v in setting.items()},
            "critiqued": critiqued, "intrinsic_per_response": sum(intrinsic_totals) / len(intrinsic_totals),
            "eval": evaluate_policy(policy.lm, tokenizer, ctx, seed=seed),
            "seconds": round(time.perf_counter() - started, 2)}


def run_ablation(recorded: list[list[dict]], ctx, *, seed: int) -> dict:
    """Replay every setting of ablation_settings; assert that no critic call was made.

    ctx.critic must be a cache-only critic (allow_calls False) over the study's cache.
    """
    assert not ctx.critic.allow_calls, "the ablation critic must be cache-only"
    calls_before = ctx.critic.tally.calls
    results = [replay_setting(s, recorded, ctx, seed=seed) for s in ablation_settings(ctx.config)]
    assert ctx.critic.tally.calls == calls_before, "the ablation replay made a critic call"
    return {"source": {"arm": "dense_all", "seed": seed, "rounds": len(recorded)},
            "critic": ctx.critic.tally.as_dict(), "settings": results}
