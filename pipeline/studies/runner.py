"""PPO rounds of one arm and seed, in-process, with the steps the stages call: rollout (sample_rollouts), score
(score_round, the world's reward in a task reward's shape), critique (critique_round), PPO (join_round + the
trainer).

Every arm and seed starts from the same cached base model. For a given seed the train prompts
picked in each round and the sampler seed are the same in every arm, so round 1 (sampled from
the base policy) holds identical rollouts in all arms: common random numbers across arms. The
study draws its prompts from one stream per seed (not the rollout stage's per-round picker), then
samples them with the rollout stage's own pipeline.steps.rollout.sample_rollouts. A GRPO arm draws
batch_size / G prompts a round and samples G responses to each (the same batch_size rollouts as a PPO
arm), so its rollouts share the seed and sampler streams with the other GRPO arm, not with the PPO arms.
"""
from __future__ import annotations

import random
import time

import torch

from pipeline.core.config import ScoreParams
from pipeline.core.seeding import round_seed
from pipeline.critic.annotate import skipped_row
from pipeline.evaluate.decode import sample_continuations
from pipeline.model.policy import frozen_copy, load_policy
from pipeline.rewards.shaping import population_std, shape
from pipeline.steps.critique import critique_round, scored_rows
from pipeline.steps.ppo_round import join_round, new_kl_controller
from pipeline.steps.rollout import encode_query, sample_rollouts
from pipeline.steps.score import score_round
from pipeline.studies.arms import Arm
from pipeline.tasks import get_task
from pipeline.train.ppo import RunningMoments
from pipeline.train.trainer import make_optimizer, train_round

EVAL_SEED_STREAM = 9  # round_seed stream of the evaluation sampler


class StudyContext:
    """What every run shares: config, world, base folder, critic template, critic and cache."""

    def __init__(self, *, config, world, base_dir, template, critic, cache):
        self.config, self.world, self.base_dir = config, world, base_dir
        self.template, self.critic, self.cache = template, critic, cache


class WorldReward:
    """A synthetic world's environment reward in the shape the score stage calls a task's reward with
    (pipeline/steps/score.py score_round): scores in the task's units, read with the responses' queries."""

    needs_queries = True
    version = "study"

    def __init__(self, world):
        self.world, self.name = world, f"study:{type(world).__name__}"

    def score(self, responses: list[str], *, references: list[str], queries: list[str]) -> list[float]:
        return self.world.env_rewards(responses, queries)


def _rollouts(policy, tokenizer, ctx: StudyContext, *, picker: random.Random, seed: int, round_: int,
              group: int = 1, env_scale: float = 1.0) -> tuple[list[dict], list[dict]]:
    """The round's config.batch_size rollout rows (pipeline.steps.rollout.sample_rollouts), `group` responses to
    each of batch_size / group prompts `picker` draws, each with its env_reward; and their score rows, from the
    score stage's own score_round (score.scale = env_scale: env_reward_shaped is what PPO reads)."""
    prompts = ctx.world.train_prompts
    chosen = [{"prompt_id": f"train-{i:05d}", "text": prompts[i]}
              for i in picker.sample(range(len(prompts)), ctx.config.batch_size // group)]  # as sampling `prompts`
    run_id = f"sample-efficiency:{seed}"
    rows, _ = sample_rollouts(policy, tokenizer, chosen, policy_name="study", run_id=run_id,
                              round_=round_, seed=seed, max_new_tokens=ctx.config.max_new_tokens,
                              generation_batch_size=ctx.config.batch_size, progress=False, samples_per_prompt=group)
    scores, _ = score_round(rows, None, task=ctx.config.task, run_id=run_id, round_=round_,
                            params=ScoreParams(scale=env_scale), reward=WorldReward(ctx.world), progress=False)
    return scored_rows(rows, scores), scores


def annotate_arm(rows: list[dict], arm: Arm, ctx: StudyContext, tokenizer, *, rewards: dict[str, float],
                alignment: str = "exact", threshold: float | None = None) -> list[dict]:
    """The round's annotation rows under `arm`: the critique stage's critique_round, or all skipped.

    Raises CriticError if any critiqued response failed (the study tolerates no failure).
    """
    if not arm.critic:
        return [skipped_row(row) for row in rows]
    critic = arm.critic_params(rewards=rewards, alignment=alignment, threshold=threshold)
    annotated, _ = critique_round(rows, client=ctx.critic, cache=ctx.cache, template=ctx.template,
                                  fields=get_task(ctx.config.task).critic_fields, tokenizer=tokenizer,
                                  critic=critic, progress=False)
    return annotated


def ppo_batch(rows: list[dict], annotated: list[dict], *, env_scale: float = 1.0):
    """The PPO batch of recorded rows (with their env_reward; the ablation replays them): their env rewards shaped
    as the score stage shapes them (pipeline/rewards/shaping.py, score.scale = env_scale), joined by
    pipeline.steps.ppo_round.join_round."""
    shaped = shape([r["env_reward"] for r in rows], scale=env_scale)
    scores = [{"rollout_id": r["rollout_id"], "env_reward_shaped": s} for r, s in zip(rows, shaped)]
    return join_round(rows, scores, annotated)


def _round_record(round_: int, rows: list[dict], scores: list[dict], annotated: list[dict], stats: list[dict],
                  ctx: StudyContext, seconds: float) -> dict:
    """The round's record; its total reward is the shaped env reward PPO read (the score rows') + the span rewards."""
    env, intrinsic = [r["env_reward"] for r in rows], [a["token_rewards"] for a in annotated]
    critiqued = sum(a["critiqued"] for a in annotated)
    totals = [s["env_reward_shaped"] + sum(t) for s, t in zip(scores, intrinsic, strict=True)]
    return {"round": round_, "rollouts": round_ * len(rows), "env_reward": sum(env) / len(env),
            "total_reward": sum(totals) / len(totals), "env_reward_std": population_std(env),
            "total_reward_std": population_std(totals), "kl": stats[0]["kl"],
            "kl_coef": stats[0]["kl_coef"], "critiqued": critiqued, "seconds": round(seconds, 3),
            **ctx.world.batch_metrics([r["query"] for r in rows], [r["response"] for r in rows])}


def run_arm(arm: Arm, seed: int, ctx: StudyContext, *, keep_rollouts: bool = False) -> dict:
    """Train one arm for config.rounds rounds from the base model (with a value head for PPO only); evaluate
    the final policy.

    Returns {"arm", "seed", "rounds": [per-round record], "eval": metrics, "seconds",
    "rollouts": recorded rollout rows per round (only when keep_rollouts)}.
    """
    started, cfg, params = time.perf_counter(), ctx.config, arm.ppo_params(ctx.config.ppo)
    torch.manual_seed(seed)
    policy, tokenizer = load_policy(ctx.base_dir, seed=seed, value_head=params.algorithm == "ppo")
    reference = frozen_copy(policy)
    optimizer, kl_controller, moments = make_optimizer(policy, params.learning_rate), new_kl_controller(params), RunningMoments()
    rewards = cfg.rewards
    picker, records, recorded = random.Random(f"sample-efficiency:{seed}"), [], []
    ctx.critic.arm = arm.name
    for round_ in range(1, cfg.rounds + 1):
        round_started = time.perf_counter()
        rows, scores = _rollouts(policy, tokenizer, ctx, picker=picker, seed=seed, round_=round_,
                                 group=arm.samples_per_prompt, env_scale=arm.env_scale)
        annotated = annotate_arm(rows, arm, ctx, tokenizer, rewards=rewards)
        stats = train_round(policy=policy, ref_model=reference, optimizer=optimizer,
                            batch=join_round(rows, scores, annotated), params=params,
                            kl_controller=kl_controller, score_moments=moments, seed=round_seed(seed, round_, 4),
                            progress=False, group_size=arm.samples_per_prompt, max_completion_length=cfg.max_new_tokens)
        records.append(_round_record(round_, rows, scores, annotated, stats, ctx,
                                     time.perf_counter() - round_started))
        if keep_rollouts:
            recorded.append(rows)
    out = {"arm": arm.name, "seed": seed, "rounds": records, "eval": evaluate_policy(policy.lm, tokenizer, ctx, seed=seed)}
    out["seconds"] = round(time.perf_counter() - started, 2)
    if keep_rollouts:
        out["rollouts"] = recorded
    return out


def evaluate_policy(lm, tokenizer, ctx: StudyContext, *, seed: int) -> dict:
    """The world's evaluation metrics of `lm` on the held-out prompts (nucleus samples, seeded)."""
    cfg, k = ctx.config, ctx.config.eval_samples_per_prompt
    queries = [encode_query(tokenizer, p) for p in ctx.world.eval_prompts for _ in range(k)]
    continuations = sample_continuations(lm, tokenizer, queries, max_new_tokens=cfg.max_new_tokens,
                                         top_p=cfg.eval_top_p, seed=round_seed(seed, 0, EVAL_SEED_STREAM),
                                         batch_size=64)
    texts = [tokenizer.decode(c, skip_special_tokens=True) for c in continuations]
    by_prompt = [texts[i:i + k] for i in range(0, len(texts), k)]
    return ctx.world.eval_metrics(ctx.world.eval_prompts, by_prompt)


def evaluate_base(ctx: StudyContext, seed: int) -> dict:
    """Evaluation metrics of the base model itself (every arm's starting point)."""
    policy, tokenizer = load_policy(ctx.base_dir, seed=seed)
    return evaluate_policy(policy.lm, tokenizer, ctx, seed=seed)
