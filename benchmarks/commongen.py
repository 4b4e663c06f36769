"""CommonGen, the task-file example: base against trained, dense against sparse, from two finished runs.

Each run is `dvc repro` of configs/commongen.yaml in its own project folder: the dense run as the profile is,
the sparse control with critic.enabled false (docs/own-task.md). This reads what their evaluate stages wrote
(metrics/eval.json, the eval_samples table, metrics/rounds.json) and adds the dense-minus-sparse difference of
the final policies' coverage, paired over the eval prompts (each prompt's mean over its samples), with its
standard error.

Usage:  python -m benchmarks.commongen --dense DIR --sparse DIR [--out benchmarks/results/commongen.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from pipeline.core import store

METRICS = ("coverage", "all_concepts", "perplexity", "dist_2", "env_reward_mean")


def final_policy(run: Path) -> str:
    return next(name for name in json.loads((run / "metrics/eval.json").read_text()) if name != "base")


def eval_metrics(run: Path) -> dict:
    """{policy: {metric: value}} of the run's world (dev) prompt set."""
    return {policy: {m: sets["world"][m] for m in METRICS}
            for policy, sets in json.loads((run / "metrics/eval.json").read_text()).items()}


def per_prompt_reward(run: Path, policy: str) -> dict[str, float]:
    """Each eval prompt's mean reward (the coverage) over its samples, for `policy`."""
    folder = run / "data/eval_samples" / final_policy(run)
    by_prompt: dict[str, list[float]] = {}
    for row in store.read_table(folder, "eval_samples"):
        if row["policy"] == policy:
            by_prompt.setdefault(row["prompt_id"], []).append(row["env_reward"])
    return {prompt: statistics.fmean(values) for prompt, values in by_prompt.items()}


def paired_difference(a: dict[str, float], b: dict[str, float]) -> tuple[float, float, int]:
    """(mean of a - b over shared keys, its standard error, n)."""
    diffs = [a[k] - b[k] for k in sorted(set(a) & set(b))]
    return statistics.fmean(diffs), statistics.stdev(diffs) / len(diffs) ** 0.5, len(diffs)


def training_rewards(run: Path) -> list[float]:
    return [r["env_reward_mean"] for r in json.loads((run / "metrics/rounds.json").read_text())["rounds"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dense", type=Path, required=True)
    parser.add_argument("--sparse", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "commongen.json")
    args = parser.parse_args()
    final = final_policy(args.dense)
    mean, se, n = paired_difference(per_prompt_reward(args.dense, final), per_prompt_reward(args.sparse, final))
    result = {"dense": eval_metrics(args.dense), "sparse": eval_metrics(args.sparse),
              "training_reward_per_round": {"dense": training_rewards(args.dense),
                                            "sparse": training_rewards(args.sparse)},
              "dense_minus_sparse_coverage": {"mean": mean, "standard_error": se, "eval_prompts": n},
              "final_policy": final}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("| run | policy | " + " | ".join(METRICS) + " |\n|---|---|" + "---|" * len(METRICS))
    for run in ("dense", "sparse"):
        for policy, values in result[run].items():
            print(f"| {run} | {policy} | " + " | ".join(f"{values[m]:.3f}" for m in METRICS) + " |")
    print(f"dense minus sparse, coverage of the final policy: {mean:+.3f} ± {se:.3f} (SE, {n} dev prompts)")


if __name__ == "__main__":
    main()
