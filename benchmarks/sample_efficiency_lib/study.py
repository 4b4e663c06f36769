"""Run the whole study: base model, five arms x seeds, scale factor, headline, ablation -> one result dict."""
from __future__ import annotations

import platform
import tempfile
import time
from pathlib import Path

import torch
import transformers

from pipeline.critic.cache import CriticCache
from pipeline.critic.templates import load_template

from benchmarks.sample_efficiency_lib.ablation import run_ablation
from benchmarks.sample_efficiency_lib.analysis import headline, mean, scale_factor
from benchmarks.sample_efficiency_lib.arms import study_arms
from benchmarks.sample_efficiency_lib.base_cache import cached_base
from benchmarks.sample_efficiency_lib.critic import GPT35_PRICES, InProcessLexiconCritic
from benchmarks.sample_efficiency_lib.runner import StudyContext, evaluate_base, run_arm
from benchmarks.sample_efficiency_lib.world import SentimentStudyWorld

ROOT = Path(__file__).resolve().parents[2]
WORLD_NOTES = {
    "name": "sentiment (synthetic review world, pipeline/data/world.py)",
    "env_reward": "P(positive) of the response under a naive Bayes classifier fit on sequence-level tone labels "
                  "of 4000 world reviews (its own seed stream)",
    "critic": "the lexicon backend (VADER lexicon spans, pipeline/critic/lexicon.py), ±0.5 per span token, exact alignment",
    "can_show": "whether per-token credit on sentiment words speeds up learning a sequence-level classifier reward "
                "beyond what reward scale alone does, and lexical reward hacking (polar-word pile-up, leaving the grammar).",
    "cannot_show": "anything about a noisy or wrong critic (this one is exact for the world), long-range credit "
                   "assignment or content: sentiment here is lexical, so the classifier and the lexicon largely agree "
                   "by construction, and a gain here is an upper bound for a real critic.",
}


def _log(progress: bool, message: str) -> None:
    if progress:
        print(message, flush=True)


def _run_arm_seeds(arm, ctx, seeds, progress, keep_first=False) -> list[dict]:
    runs = []
    for i, seed in enumerate(seeds):
        run = run_arm(arm, seed, ctx, keep_rollouts=keep_first and i == 0)
        last = run["rounds"][-1]
        _log(progress, f"  {arm.name} seed {seed}: {run['seconds']:.0f}s, last env {last['env_reward']:.3f}, "
                       f"kl {last['kl']:.2f}, eval env {run['eval']['env_reward_mean']:.3f}")
        runs.append(run)
    return runs


def run_study(config, *, scratch: str | Path, progress: bool = True) -> dict:
    """Run every arm for every seed from one cached base model and return the result dict (JSON-ready)."""
    started = time.perf_counter()
    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()
    base_dir, base_info = cached_base(scratch, world_seed=config.world_seed, n_reviews=config.n_reviews, base=config.base)
    _log(progress, f"base model: {base_dir} (cached: {base_info['cached']}, pretraining {base_info['seconds']}s)")
    world = SentimentStudyWorld(world_seed=config.world_seed, n_train_prompts=config.n_train_prompts,
                                n_eval_prompts=config.n_eval_prompts, classifier_size=config.env_classifier_size)
    arms = study_arms(config.selective_threshold)
    with tempfile.TemporaryDirectory(dir=scratch, prefix="critic-cache-") as cache_dir, CriticCache(cache_dir) as cache:
        critic = InProcessLexiconCritic(prices=GPT35_PRICES)
        ctx = StudyContext(config=config, world=world, base_dir=base_dir,
                           template=load_template(ROOT / "prompts" / "sentiment.md"), critic=critic, cache=cache)
        by_arm: dict[str, list[dict]] = {}
        for name in ("sparse", "dense_all"):
            _log(progress, f"arm {name}")
            by_arm[name] = _run_arm_seeds(arms[name], ctx, config.seeds, progress, keep_first=name == "dense_all")
        k = scale_factor(by_arm["dense_all"], by_arm["sparse"])
        arms["sparse_scaled"] = arms["sparse_scaled"].with_scale(k)
        for name in ("sparse_scaled", "dense_selective", "dense_zero_mean"):
            _log(progress, f"arm {name}" + (f" (k = {k:.3f})" if name == "sparse_scaled" else ""))
            by_arm[name] = _run_arm_seeds(arms[name], ctx, config.seeds, progress)
        recorded = by_arm["dense_all"][0].pop("rollouts")
        _log(progress, "ablation (replay, cache only)")
        replay_ctx = StudyContext(config=config, world=world, base_dir=base_dir, template=ctx.template,
                                  critic=InProcessLexiconCritic(prices=GPT35_PRICES, allow_calls=False), cache=cache)
        ablation = run_ablation(recorded, replay_ctx, seed=config.seeds[0])
        base_eval = [dict(evaluate_base(ctx, seed), seed=seed) for seed in config.seeds]
    return {
        "study": "sample_efficiency", "preset": config.preset, "config": config.as_dict(), "world": WORLD_NOTES,
        "base": {**base_info, "eval": base_eval},
        "scale_factor": {"k": k, "method": "mean total reward of dense_all (env + sum of token rewards, every round "
                                           "and seed) / mean env reward of sparse (every round and seed)",
                         "dense_all_mean_total_reward": mean([r["total_reward"] for run in by_arm["dense_all"] for r in run["rounds"]]),
                         "sparse_mean_env_reward": mean([r["env_reward"] for run in by_arm["sparse"] for r in run["rounds"]]),
                         "sparse_scaled_mean_total_reward": mean([r["total_reward"] for run in by_arm["sparse_scaled"] for r in run["rounds"]])},
        "arms": {name: {"spec": arms[name].describe(), "runs": runs} for name, runs in by_arm.items()},
        "headline": headline(by_arm, batch_size=config.batch_size, final_window=config.final_window),
        "critic": critic.tally.as_dict(), "ablation": ablation,
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "cpus": _cpus(),
                    "threads": torch.get_num_threads(), "shared": True},
        "wall_seconds": round(time.perf_counter() - started, 1),
    }


def _cpus() -> int:
    import os

    return os.cpu_count() or 0
