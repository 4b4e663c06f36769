"""The real-text study as DVC experiments on drlc's real pipeline (dvc.yaml, params.yaml): which critic pays?

Usage (from a drlc project whose params.yaml is configs/study-detox.yaml; it must be a git repo with a commit):

    python benchmarks/sample_efficiency_dvc.py --critics tagger random --seeds 0 1 2
    python benchmarks/sample_efficiency_dvc.py --critics tagger random --dry-run   # print the dvc commands only

Phase 1 queues sparse and one dense arm per critic (pipeline/studies/critics.py) under each of --algorithms with
``dvc exp run --queue -n <arm>-s<seed> -S ...`` and runs them (``dvc exp run --run-all -j 1``, or one
``dvc exp run --temp`` each with ``--runner temp``). Phase 2 computes sparse_scaled's scale k from the finished
reference arm and sparse (pipeline/studies/analysis.py's ``scale_factor``) and runs it with ``score.scale=k``.
Results are read without touching the workspace: params and metrics with ``dvc exp show --json``,
metrics/rounds.json (a DVC plot, so not in exp show) with ``git show <exp rev>:metrics/rounds.json``, per-response
tables with ``dvc.api.open(..., rev=<exp rev>)``. Experiments that already exist under an arm's name are collected,
not re-run, so an interrupted set resumes. Every arm sets all of its keys, so the arms do not depend on what the
project's params.yaml holds for them. The synthetic worlds' arms run through `drlc study` (configs/study/arms.yaml).
Docs: docs/sample-efficiency-dvc.md, docs/study-real-text.md.
"""
from __future__ import annotations

import argparse
import io
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import yaml

from pipeline.commands.rounds import exp_run_overrides
from pipeline.commands.study import (  # the DVC side of `drlc study`, shared
    dvc,
    existing,
    exp_name,
    hydra_value,
    run_queued,
    set_prefix,
)
from pipeline.core.cache import link_outside
from pipeline.core.config import load_params
from pipeline.core.errors import ConfigError, DataError
from pipeline.studies import critics, generated_blocks, real_text
from pipeline.studies.analysis import mean, mean_std, scale_factor, seed_mean_curve, sparse_target, steps_to_reach
from pipeline.studies.study_report import response_spread

ROOT = Path(__file__).resolve().parents[1]

def rounds_overrides(n_rounds: int | None, per_stage: int = 1) -> list[str]:
    """-S values replacing the `rounds` section with n rounds, K = per_stage a stage
    (pipeline.commands.rounds.exp_run_overrides); None keeps params.yaml's."""
    if n_rounds is None and per_stage != 1:
        raise ConfigError(f"--per-stage {per_stage} needs --rounds N: the chunks are laid out for N rounds")
    return [] if n_rounds is None else exp_run_overrides(n_rounds, per_stage)


def run_command(arm: str, seed: int, settings: dict, extra: list[str], *, runner: str) -> list[str]:
    """The `dvc exp run` command of one experiment (queued, or run now in a temp folder)."""
    sets = [f"run.seed={seed}"] + [f"{set_prefix(value)}{key}={hydra_value(value)}" for key, value in settings.items()]
    sets += extra
    mode = ["--queue"] if runner == "queue" else ["--temp"]
    return [sys.executable, "-m", "dvc", "exp", "run", *mode, "-n", exp_name(arm, seed),
            *[part for s in sets for part in ("-S", s)]]


def sh(cmd: list[str], cwd: Path, *, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise DataError(f"`{' '.join(cmd[2:])}` failed in {cwd} ({result.returncode}):\n{result.stderr[-2000:]}")
    return result


def run_arms(project: Path, commands: list[list[str]], *, runner: str, dry_run: bool) -> None:
    """Queue + run the commands as `drlc study` does (its run_queued), or run each in a temp folder; raise
    DataError if any failed."""
    if runner == "queue":
        run_queued(project, [["dvc", *cmd[3:]] for cmd in commands], jobs=1, dry_run=dry_run)
        return
    for cmd in commands:
        print("$", shlex.join(cmd[2:]), flush=True)
        if not dry_run:
            dvc(project, *cmd[3:])  # drlc study's: with git's identity supplied where the user has none


def round_records(project: Path, exp: dict, *, with_spread: bool) -> list[dict]:
    """Per-round records of one experiment in the study's terms (env reward in the task's units, total as PPO saw
    it)."""
    curves = json.loads(sh(["git", "show", f"{exp['rev']}:metrics/rounds.json"], project).stdout)["rounds"]
    records = []
    for c in curves:
        record = {"round": c["round"], "env_reward": c["env_reward_mean"], "kl": c["kl"],
                  "total_reward": c["env_reward_shaped_mean"] + c["intrinsic_reward_sum"],
                  "intrinsic_reward_sum": c["intrinsic_reward_sum"], "critiqued": c["critiqued"],
                  "critic_requests": c["critic_requests"], "cache_hits": c["cache_hits"],
                  "critic_cost_usd": c["critic_cost_usd"]}
        if with_spread:
            chunks = exp["params"].get("chunks") or {}
            record.update(response_spread(project, exp["rev"], c["round"], chunks))
        records.append(record)
    return records


def eval_sample_pairs(project: Path, rev: str, policy: str, n: int = 5) -> list[dict]:
    """The first n held-out prompts' first samples, base against final policy, with their env rewards."""
    import dvc.api
    import pyarrow.parquet as pq

    with dvc.api.open(f"data/eval_samples/{policy}/part-0.parquet", repo=str(project), rev=rev, mode="rb") as f:
        rows = [r for r in pq.read_table(io.BytesIO(f.read())).to_pylist() if r["sample"] == 0]
    final = {r["prompt_id"]: r for r in rows if r["policy"] != "base"}
    base = sorted((r for r in rows if r["policy"] == "base" and r["prompt_id"] in final), key=lambda r: r["prompt_id"])
    return [{"prompt": r["query"], "base": r["response"], "base_env_reward": r["env_reward"],
             "final": final[r["prompt_id"]]["response"], "final_env_reward": final[r["prompt_id"]]["env_reward"]}
            for r in base[:n]]


def run_record(project: Path, exp: dict, arm: str, seed: int, *, with_spread: bool) -> dict:
    """One experiment: its rounds, final-policy eval metrics (env reward in the task's units), critic totals."""
    scale = float(exp["params"]["score"]["scale"])
    evaluated = exp["metrics"].get("metrics/eval.json", {})
    final = {name: sets for name, sets in evaluated.items() if name != "base"}
    eval_metrics = {f"{s}/{m}": v
                    for sets in final.values() for s, values in sets.items() for m, v in values.items()
                    if isinstance(v, (int, float))}
    rounds = round_records(project, exp, with_spread=with_spread)
    return {"arm": arm, "seed": seed, "experiment": exp_name(arm, seed), "rev": exp["rev"], "score_scale": scale,
            "rounds": rounds, "eval": eval_metrics,
            "critic": {key: sum(r[key] for r in rounds)
                       for key in ("critiqued", "critic_requests", "cache_hits", "critic_cost_usd")}}


def headline(by_arm: dict[str, list[dict]], *, final_window: int) -> dict:
    """Rounds to sparse's final reward, final env reward / KL and eval metrics per arm (mean ± std over seeds)."""
    target = sparse_target(by_arm["sparse"], final_window)
    out = {"sparse_target": target, "final_window": final_window, "arms": {}}
    for arm, runs in by_arm.items():
        def final(key):
            return mean_std([mean([r[key] for r in run["rounds"][-final_window:]]) for run in runs])
        metrics = sorted({m for run in runs for m in run["eval"]})
        out["arms"][arm] = {
            "rounds_to_target": steps_to_reach(seed_mean_curve(runs, "env_reward"), target),
            "final_env_reward": final("env_reward"), "final_kl": final("kl"),
            "final_intrinsic_reward_sum": final("intrinsic_reward_sum"),
            "eval": {m: mean_std([run["eval"][m] for run in runs if m in run["eval"]]) for m in metrics},
            "critic_requests": sum(run["critic"]["critic_requests"] for run in runs),
            "critic_critiqued": sum(run["critic"]["critiqued"] for run in runs)}
    return out


def markdown(result: dict) -> str:
    """A short Markdown table of the headline (one row per arm)."""
    head = result["headline"]
    evals = sorted({m for a in head["arms"].values() for m in a["eval"]})
    evals = [m for m in evals if not m.endswith("/n_samples")]

    def ms(v):
        return f"{v['mean']:.3f} ± {v['std']:.3f}"
    lines = [f"### Sample efficiency as DVC experiments ({result['task']}, seeds {result['seeds']}, "
             f"{result['rounds']} rounds)", "",
             f"Target = sparse's seed-mean env reward over its last {head['final_window']} rounds = "
             f"{head['sparse_target']:.3f}; sparse_scaled's k = {result['scale_factor']['k']:.3f} "
             f"(matched by {result['scale_factor']['match']}). Env rewards are unscaled (divided by score.scale).", "",
             "| arm | rounds to target | final env reward | final KL | critic requests | "
             + " | ".join(f"eval {m}" for m in evals) + " |",
             "|---" * (5 + len(evals)) + "|"]
    for arm, a in head["arms"].items():
        reached = "-" if a["rounds_to_target"] is None else str(a["rounds_to_target"])
        cells = [arm, reached, ms(a["final_env_reward"]), ms(a["final_kl"]), str(a["critic_requests"])]
        cells += [ms(a["eval"][m]) if m in a["eval"] else "-" for m in evals]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Wall time {result['wall_seconds'] / 60:.1f} min; experiments: "
              + ", ".join(r["experiment"] for runs in result["runs"].values() for r in runs) + "."]
    return "\n".join(lines) + "\n"


class Unfinished(Exception):
    """Raised when --max-new stopped a phase with experiments still to run (the same command resumes)."""


def run_phase(project, arms, seeds_of, settings_of, extra, *, runner, dry_run, max_new=None) -> int:
    """Queue and run each (arm, seed in seeds_of(arm)) not yet an experiment, with params settings_of(arm, seed).

    max_new: run at most this many of them, then raise Unfinished naming the rest (None: all).
    Returns how many were run.
    """
    done = {} if dry_run else existing(project)
    if not dry_run:
        link_outside(project)
    todo = [(arm, seed) for arm in arms for seed in seeds_of(arm) if exp_name(arm, seed) not in done]
    now = todo if max_new is None or dry_run else todo[:max_new]
    run_arms(project, [run_command(arm, seed, settings_of(arm, seed), extra, runner=runner) for arm, seed in now],
             runner=runner, dry_run=dry_run)
    if len(now) < len(todo):
        raise Unfinished([exp_name(arm, seed) for arm, seed in todo[len(now):]])
    return len(now)


def collect(project, arms, seeds_of, *, with_spread) -> dict[str, list[dict]]:
    done = existing(project)
    missing = [exp_name(a, s) for a in arms for s in seeds_of(a) if exp_name(a, s) not in done]
    if missing:
        raise DataError(f"experiments {missing} are missing in {project}: see `dvc queue status`")
    return {arm: [run_record(project, done[exp_name(arm, s)], arm, s, with_spread=with_spread)
                  for s in seeds_of(arm)] for arm in arms}


def real_text_report(project: Path, by_arm: dict, args, *, policy: str, final_window: int, batch_size: int) -> dict:
    """The real-text study's section: per-arm gains with paired intervals, the critic table, samples, the plot."""
    quality = json.loads(args.critic_quality.read_text())["critics"]
    rows = real_text.arm_rows(by_arm, quality, final_window=final_window, batch_size=batch_size)
    samples = {arm: eval_sample_pairs(project, runs[0]["rev"], policy) for arm, runs in by_arm.items()}
    plot = real_text.plot_gain_vs_f1(rows, args.out.with_name(args.out.stem + "_gain_vs_f1.png"))
    curves = real_text.plot_learning_curves(by_arm, target=sparse_target(by_arm["sparse"], final_window),
                                            batch_size=batch_size, path=args.out.with_name(args.out.stem + "_curves.png"))
    return {"arms": rows, "critic_quality": {c: quality.get(c) for c in args.critics}, "samples": samples,
            "plot": plot.name, "curves": curves.name, "batch_size": batch_size, "table": real_text.markdown(rows)}


def study_design(args):
    """(phase-1 arms, the arm sparse_scaled's k is matched to or None, settings_of(arm, seed, k)): the real-text
    arms (pipeline/studies/critics.py) of --critics under each of --algorithms."""
    arms = critics.study_arms(args.critics, args.algorithms, args.value_free_critics)
    scaled = "sparse_scaled" in arms
    reference = args.scale_reference or critics.SCALE_REFERENCE
    first = ["sparse"] + [a for a in arms if a not in ("sparse", "sparse_scaled")]  # sparse: the target
    first += [reference] if scaled and reference not in first else []
    return first, reference if scaled else None, lambda a, seed, k=None: critics.settings(a, seed=seed, k=k)


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--project", type=Path, default=Path.cwd(), help="drlc project (git + DVC repo)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=None, help="replace params.yaml's rounds with N rounds")
    parser.add_argument("--per-stage", type=int, default=1,
                        help="with --rounds: K rounds a stage (chunk stages: one model load per K rounds)")
    parser.add_argument("--critics", nargs="+", required=True, choices=list(critics.CRITICS),
                        help="sparse, sparse_scaled and a dense arm per critic")
    parser.add_argument("--algorithms", nargs="+", default=["ppo"], choices=list(critics.ALGORITHMS),
                        help="with --critics: run the arms under each algorithm (value-free ones: no sparse_scaled)")
    parser.add_argument("--value-free-critics", nargs="+", default=None, choices=list(critics.CRITICS),
                        help="with --critics: the critics with a dense arm under the value-free --algorithms "
                             "(default: all of --critics)")
    parser.add_argument("--scale-reference", default=None,
                        help=f"the dense arm sparse_scaled's k is matched to (default {critics.SCALE_REFERENCE})")
    parser.add_argument("--main-seeds", type=int, nargs="+", default=None,
                        help="seeds of sparse, sparse_scaled, the scale reference and dense_random, under every "
                             "algorithm (default: --seeds)")
    parser.add_argument("--runner", choices=("queue", "temp"), default="queue")
    parser.add_argument("--scale-match", choices=("mean", "std"), default="std")
    parser.add_argument("--final-window", type=int, default=3)
    parser.add_argument("--critic-quality", type=Path, default=ROOT / "benchmarks" / "results" / "study_critics.json",
                        help="each critic's char F1 (benchmarks/study_critics.py)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "sample_efficiency_dvc.json")
    parser.add_argument("--doc", type=Path, default=None,
                        help="also write the result into this page's real-text block (docs/results.md)")
    parser.add_argument("--dry-run", action="store_true", help="print the dvc commands only")
    parser.add_argument("--max-new", type=int, default=None,
                        help="run at most N new experiments, then stop (run the same command again to go on)")
    args = parser.parse_args(argv)
    started, project = time.perf_counter(), args.project.resolve()
    params = yaml.safe_load((project / "params.yaml").read_text())
    extra = rounds_overrides(args.rounds, args.per_stage)
    n_rounds = args.rounds or len(load_params(project / "params.yaml").round_keys())  # per-round or chunked
    first, reference, settings_of = study_design(args)
    main_seeds = args.main_seeds or args.seeds
    # the best critic and its random control keep their seeds under every algorithm
    main_arms = {"sparse", "sparse_scaled", args.scale_reference or critics.SCALE_REFERENCE,
                 critics.RANDOM_CONTROL}

    def seeds_of(arm: str) -> list[int]:  # a real-text arm under any algorithm counts as its reward arm
        return main_seeds if critics.split_name(arm)[0] in main_arms else args.seeds

    try:
        return study(project, args, params, first, reference, settings_of, seeds_of, extra, n_rounds, started)
    except Unfinished as left:
        print(f"stopped after --max-new {args.max_new} new experiments; left: {left.args[0]} (and sparse_scaled "
              "once its k can be computed); run the same command again", flush=True)
        return None


def study(project, args, params, first, reference, settings_of, seeds_of, extra, n_rounds, started) -> dict | None:
    """Both phases, the collection and the report of :func:`main` (Unfinished when --max-new stops it)."""
    ran = run_phase(project, first, seeds_of, settings_of, extra, runner=args.runner, dry_run=args.dry_run,
                    max_new=args.max_new)
    k, by_arm = None, {}
    if not args.dry_run:
        by_arm = collect(project, first, seeds_of, with_spread=True)
    if reference is not None:
        k = "<k>" if args.dry_run else scale_factor(by_arm[reference], by_arm["sparse"], args.scale_match)
        if not args.dry_run and not k > 0:
            raise DataError(f"scale k = {k} by {args.scale_match} is not positive (sparse's mean env reward is "
                            "<= 0?): use --scale-match std")
        left = None if args.max_new is None else args.max_new - ran
        run_phase(project, ["sparse_scaled"], seeds_of, lambda a, seed: settings_of(a, seed, k), extra,
                  runner=args.runner, dry_run=args.dry_run, max_new=left)
        if not args.dry_run:
            by_arm.update(collect(project, ["sparse_scaled"], seeds_of, with_spread=True))
    if args.dry_run:
        return None
    window = min(args.final_window, n_rounds)
    result = {"study": "sample_efficiency_dvc", "project": str(project), "task": params["run"]["task"],
              "seeds": args.seeds, "main_seeds": args.main_seeds or args.seeds, "rounds": n_rounds,
              "runner": args.runner,
              "arms": {a: settings_of(a, args.seeds[0], k) for a in by_arm},
              "scale_factor": {"k": k if k is not None else float("nan"), "match": args.scale_match,
                               "reference": reference},
              "runs": by_arm, "headline": headline(by_arm, final_window=window)}
    policy = f"round={n_rounds:04d}" if args.rounds else params["evaluate"]["policy"]
    result["real_text"] = real_text_report(project, by_arm, args, policy=policy, final_window=window,
                                           batch_size=int(params["rollout"]["batch_size"]))
    result["wall_seconds"] = round(time.perf_counter() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    args.out.with_suffix(".md").write_text(markdown(result))
    if args.doc:
        generated_blocks.splice_file(args.doc, real_text.results_block(result), real_text.BLOCK_START,
                                     real_text.BLOCK_END)
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
