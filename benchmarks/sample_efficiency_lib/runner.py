"""PPO rounds of one arm and seed, in-process, with drlc's sampler, critic annotation and trainer.

Every arm and seed starts from the same cached base model. For a given seed the train prompts
picked in each round and the sampler seed are the same in every arm, so round 1 (sampled from
the base policy) holds identical rollouts in all arms: common random numbers across arms.
"""
from __future__ import annotations

import random
import time

import torch

from pipeline.critic.annotate import annotate_round, zero_mean_rewards
from pipeline.evaluate.decode import sample_continuations
from pipeline.policy import frozen_copy, load_policy
from pipeline.sampling import sample_responses
from pipeline.ppo import RunningMoments
from pipeline.steps.ppo_round import new_kl_controller
from pipeline.seeding import round_seed
from pipeline.trainer import RolloutBatch, make_optimizer, train_round

from benchmarks.sample_efficiency_lib.arms import Arm

EVAL_SEED_STREAM = 9  # round_seed stream of the evaluation sampler


class StudyContext:
    """What every run shares: config, world, base folder, critic template, critic and cache."""

    def __init__(self, *, config, world, base_dir, template, critic, cache):
        self.config, self.world, self.base_dir = config, world, base_dir
        self.template, self.critic, self.cache = template, critic, cache


def _rollouts(policy, tokenizer, ctx: StudyContext, *, picker: random.Random, seed: int, round_: int) -> list[dict]:
    queries = picker.sample(ctx.world.train_prompts, ctx.config.batch_size)
    query_ids = [[tokenizer.bos_token_id] + tokenizer.encode(q) for q in queries]
    samples = sample_responses(policy, queries=query_ids, eos_id=tokenizer.eos_token_id,
                               pad_id=tokenizer.pad_token_id, max_new_tokens=ctx.config.max_new_tokens,
                               seed=round_seed(seed, round_, 2), batch_size=ctx.config.batch_size, progress=False)
    responses = [tokenizer.decode(s["response_ids"], skip_special_tokens=True) for s in samples]
    env = ctx.world.env_rewards(responses, queries)
    return [{"rollout_id": f"r{round_:04d}-{i:05d}", "query": q, "query_ids": qi, "response": text,
             "response_ids": s["response_ids"], "behaviour_logprobs": s["behaviour_logprobs"], "env_reward": e}
            for i, (q, qi, s, text, e) in enumerate(zip(queries, query_ids, samples, responses, env))]


def intrinsic_rewards(rows: list[dict], arm: Arm, ctx: StudyContext, tokenizer, *, rewards: dict[str, float],
                      alignment: str = "exact", threshold: float | None = None) -> tuple[list[list[float]], int]:
    """Per-token critic rewards of each row under `arm` (zeros when it has no critic), and the count critiqued."""
    if not arm.critic:
        return [[0.0] * len(r["response_ids"]) for r in rows], 0
    annotations = annotate_round(rows, template=ctx.template, tokenizer=tokenizer, client=ctx.critic, cache=ctx.cache,
                                 threshold=arm.threshold if threshold is None else threshold, rewards=rewards,
                                 alignment=alignment, progress=False)
    failed = [a["status"] for a in annotations if a["critiqued"] and a["status"] != "ok"]
    assert not failed, f"critic annotations failed: {failed[:3]}"
    token_rewards = [a["token_rewards"] for a in annotations]
    if arm.zero_mean:
        token_rewards = [zero_mean_rewards(t) if a["critiqued"] else t for t, a in zip(token_rewards, annotations)]
    return token_rewards, sum(a["critiqued"] for a in annotations)


def population_std(values: list[float]) -> float:
    """The within-batch standard deviation (ddof 0) of a round's per-response rewards."""
    m = sum(values) / len(values)
    return (sum((v - m) ** 2 for v in values) / len(values)) ** 0.5


def _round_record(round_: int, rows: list[dict], intrinsic, arm: Arm, stats: list[dict], critiqued: int,
                  ctx: StudyContext, seconds: float) -> dict:
    env = [r["env_reward"] for r in rows]
    totals = [arm.env_scale * e + sum(t) for e, t in zip(env, intrinsic)]
    return {"round": round_, "rollouts": round_ * len(rows), "env_reward": sum(env) / len(env),
            "total_reward": sum(totals) / len(totals), "env_reward_std": population_std(env),
            "total_reward_std": population_std(totals), "kl": stats[0]["kl"],
            "kl_coef": stats[0]["kl_coef"], "critiqued": critiqued, "seconds": round(seconds, 3),
            **ctx.world.batch_metrics([r["query"] for r in rows], [r["response"] for r in rows])}


def run_arm(arm: Arm, seed: int, ctx: StudyContext, *, keep_rollouts: bool = False) -> dict:
    """Train one arm for config.rounds rounds from the base model; evaluate the final policy.

    Returns {"arm", "seed", "rounds": [per-round record], "eval": metrics, "seconds",
    "rollouts": recorded rollout rows per round (only when keep_rollouts)}.
    """
    started, cfg = time.perf_counter(), ctx.config
    torch.manual_seed(seed)
    policy, tokenizer = load_policy(ctx.base_dir, seed=seed)
    reference = frozen_copy(policy)
    optimizer, kl_controller, moments = make_optimizer(policy, cfg.ppo.learning_rate), new_kl_controller(cfg.ppo), RunningMoments()
    rewards = cfg.rewards
    picker, records, recorded = random.Random(f"sample-efficiency:{seed}"), [], []
    ctx.critic.arm = arm.name
    for round_ in range(1, cfg.rounds + 1):
        round_started = time.perf_counter()
        rows = _rollouts(policy, tokenizer, ctx, picker=picker, seed=seed, round_=round_)
        intrinsic, critiqued = intrinsic_rewards(rows, arm, ctx, tokenizer, rewards=rewards)
        batch = RolloutBatch(query_ids=[r["query_ids"] for r in rows], response_ids=[r["response_ids"] for r in rows],
                             behaviour_logprobs=[r["behaviour_logprobs"] for r in rows],
                             scores=[arm.env_scale * r["env_reward"] for r in rows], intrinsic=intrinsic)
        stats = train_round(policy=policy, ref_model=reference, optimizer=optimizer, batch=batch, params=cfg.ppo,
                            kl_controller=kl_controller, score_moments=moments, seed=round_seed(seed, round_, 4),
                            progress=False)
        records.append(_round_record(round_, rows, intrinsic, arm, stats, critiqued, ctx,
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
    queries = [[tokenizer.bos_token_id] + tokenizer.encode(p) for p in ctx.world.eval_prompts for _ in range(k)]
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
