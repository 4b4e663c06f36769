"""Run one task's study: base model, seven arms x seeds, scale factor, headline, ablation -> one result dict;
or add arms to a finished result (`add_arms`), after checking that its runs are what this code gives."""
from __future__ import annotations

import contextlib
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import torch
import transformers

from pipeline.core.cache import CriticCache
from pipeline.core.errors import DataError
from pipeline.critic.templates import load_template
from pipeline.studies.ablation import run_ablation
from pipeline.studies.analysis import headline, mean, scale_factor
from pipeline.studies.arms import GRPO_ARMS, study_arms
from pipeline.studies.base_cache import cached_base
from pipeline.studies.critic import GPT35_PRICES, TalliedCritic, lexicon_client
from pipeline.studies.runner import StudyContext, evaluate_base, run_arm
from pipeline.studies.tasks import NOTES, template_name, world_for

ROOT = Path(__file__).resolve().parents[2]
WORLD_NOTES = NOTES["sentiment"]  # kept for callers of the sentiment-only study
SCALE_METHODS = {
    "mean": "mean total reward of dense_all (env + sum of token rewards, every round and seed) / mean env reward "
            "of sparse (every round and seed)",
    "std": "sqrt(mean within-round variance of dense_all's total reward) / sqrt(mean within-round variance of "
           "sparse's env reward), every round and seed: the critic only subtracts reward, so matching the mean "
           "would scale the sparse reward down; matching the spread between responses is what competes with the "
           "KL penalty",
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


def _scale_record(config, by_arm: dict) -> dict:
    def all_rounds(arm, key):
        return mean([r[key] for run in by_arm[arm] for r in run["rounds"]])

    return {"k": scale_factor(by_arm["dense_all"], by_arm["sparse"], config.scale_match),
            "match": config.scale_match, "method": SCALE_METHODS[config.scale_match],
            "k_mean": scale_factor(by_arm["dense_all"], by_arm["sparse"], "mean"),
            "k_std": scale_factor(by_arm["dense_all"], by_arm["sparse"], "std"),
            "dense_all_mean_total_reward": all_rounds("dense_all", "total_reward"),
            "sparse_mean_env_reward": all_rounds("sparse", "env_reward"),
            "sparse_scaled_mean_total_reward": all_rounds("sparse_scaled", "total_reward")}


@contextlib.contextmanager
def _study_context(config, scratch: str | Path, progress: bool):
    """(StudyContext with a live lexicon critic, a cache-only client, base info) over a fresh critic cache."""
    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()
    base_dir, base_info = cached_base(scratch, world_seed=config.world_seed, n_reviews=config.n_reviews,
                                      base=config.base, task=config.task)
    _log(progress, f"[{config.task}] base model: {base_dir} (cached: {base_info['cached']}, pretraining "
                   f"{base_info['seconds']}s)")
    template = load_template(ROOT / "prompts" / template_name(config.task))
    with tempfile.TemporaryDirectory(dir=scratch, prefix="critic-cache-") as cache_dir, CriticCache(cache_dir) as cache, \
            lexicon_client(template_sha=template.sha256) as live, \
            lexicon_client(template_sha=template.sha256, allow_calls=False) as cache_only:
        ctx = StudyContext(config=config, world=world_for(config), base_dir=base_dir, template=template,
                           critic=TalliedCritic(live, prices=GPT35_PRICES), cache=cache)
        yield ctx, cache_only, base_info


def _machine() -> dict:
    return {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count() or 0,
            "threads": torch.get_num_threads(), "shared": True, "load_average": list(os.getloadavg())}


def run_study(config, *, scratch: str | Path, progress: bool = True) -> dict:
    """Run every arm for every seed of config.task from one cached base model; return the JSON-ready result."""
    started = time.perf_counter()
    arms = study_arms(config.selective_threshold)
    with _study_context(config, scratch, progress) as (ctx, cache_only, base_info):
        critic, world = ctx.critic, ctx.world
        by_arm: dict[str, list[dict]] = {}
        for name in ("sparse", "dense_all"):
            _log(progress, f"arm {name}")
            by_arm[name] = _run_arm_seeds(arms[name], ctx, config.seeds, progress, keep_first=name == "dense_all")
        k = scale_factor(by_arm["dense_all"], by_arm["sparse"], config.scale_match)
        arms["sparse_scaled"] = arms["sparse_scaled"].with_scale(k)
        for name in ("sparse_scaled", "dense_selective", "dense_zero_mean", *GRPO_ARMS):
            _log(progress, f"arm {name}" + (f" (k = {k:.3f})" if name == "sparse_scaled" else ""))
            by_arm[name] = _run_arm_seeds(arms[name], ctx, config.seeds, progress)
        recorded = by_arm["dense_all"][0].pop("rollouts")
        _log(progress, "ablation (replay, cache only)")
        replay_ctx = StudyContext(config=config, world=world, base_dir=ctx.base_dir, template=ctx.template,
                                  critic=TalliedCritic(cache_only, prices=GPT35_PRICES, allow_calls=False),
                                  cache=ctx.cache)
        ablation = run_ablation(recorded, replay_ctx, seed=config.seeds[0])
        base_eval = [dict(evaluate_base(ctx, seed), seed=seed) for seed in config.seeds]
    return {
        "study": "sample_efficiency", "task": config.task, "preset": config.preset, "config": config.as_dict(),
        "world": NOTES[config.task], "base": {**base_info, "eval": base_eval},
        "scale_factor": _scale_record(config, by_arm),
        "arms": {name: {"spec": arms[name].describe(), "runs": runs} for name, runs in by_arm.items()},
        "headline": headline(by_arm, batch_size=config.batch_size, final_window=config.final_window),
        "critic": critic.tally.as_dict(), "ablation": ablation, "machine": _machine(),
        "wall_seconds": round(time.perf_counter() - started, 1),
    }


def _without_timing(run: dict) -> dict:
    """A run's rounds and eval without the wall-clock fields (which differ between identical runs)."""
    return {"rounds": [{k: v for k, v in r.items() if k != "seconds"} for r in run["rounds"]], "eval": run["eval"]}


def _completed(old, new):
    """`old` (a result's config) with the keys only `new` has filled in from `new`, recursively: settings added to
    the code later (their default keeps the old behaviour; add_arms' re-run checks that it does)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return old
    return {**{k: _completed(v, new[k]) if k in new else v for k, v in old.items()},
            **{k: v for k, v in new.items() if k not in old}}


def add_arms(result: dict, config, names: list[str], *, scratch: str | Path, progress: bool = True) -> dict:
    """Run the arms `names` for every seed and add them to `result`, a finished study of `config` (in place).

    First re-runs sparse's first seed: its rounds and eval must equal the result's, so the added arms come
    from the same code path and base model as the arms already there. result["added"][arm] records each
    added arm's critic counts, wall time and machine. The headline is left to recompute_headlines.
    Raises DataError when the result's config is not `config` or the re-run differs (run the whole task again).
    """
    current = json.loads(json.dumps(config.as_dict()))
    if _completed(result["config"], current) != current:
        raise DataError(f"the {config.task} result was made with another config than the {config.preset} preset's: "
                        f"run the whole task again (without --add-arms)")
    result["config"] = current  # keys added to the code since the result was made, at their current values
    started, arms = time.perf_counter(), study_arms(config.selective_threshold)
    with _study_context(config, scratch, progress) as (ctx, _, _):
        seed = config.seeds[0]
        _log(progress, f"check: sparse seed {seed} again")
        again = run_arm(arms["sparse"], seed, ctx)
        if _without_timing(again) != _without_timing(result["arms"]["sparse"]["runs"][0]):
            raise DataError(f"re-running sparse seed {seed} of {config.task} gave other numbers than the result's: "
                            "the code or base model changed, so run the whole task again (without --add-arms)")
        for name in names:
            arm_started = time.perf_counter()
            _log(progress, f"arm {name}")
            runs = _run_arm_seeds(arms[name], ctx, config.seeds, progress)
            result["arms"][name] = {"spec": arms[name].describe(), "runs": runs}
            result.setdefault("added", {})[name] = {
                "checked": f"sparse seed {seed} re-run equal to the result's (rounds and eval)",
                "critic": dict(ctx.critic.tally.by_arm.get(name, {})), "wall_seconds": round(time.perf_counter() - arm_started, 1),
                "machine": _machine()}
    _log(progress, f"[{config.task}] added {names} in {time.perf_counter() - started:.0f} s")
    return result
