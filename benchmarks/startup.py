"""Start-up time of the stage scripts and the `drlc` commands that load no model.

Each command is one fresh process (`python stages/score.py --help`, `python -m pipeline check`, ...)
run in a checkout; the wall time covers the interpreter's start, the imports and the command. With
--baseline-tree, the same commands run in that checkout too, interleaved with this one (this tree,
baseline, this tree, ...), so both see the same machine load. Medians of --repeats runs are reported.

`drlc check` reads the checkout's own params.yaml (the demo profile) and the files it names.

Usage:  python benchmarks/startup.py [--repeats 5] [--baseline-tree DIR] [--out FILE]
Writes benchmarks/results/startup.json unless --out. The load average is recorded with the times.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

COMMANDS = {
    "prepare --help": ["stages/prepare.py", "--help"],
    "score --help": ["stages/score.py", "--help"],
    "critique --help": ["stages/critique.py", "--help"],
    "rollout --help": ["stages/rollout.py", "--help"],
    "ppo --help": ["stages/ppo.py", "--help"],
    "drlc --help": ["-m", "pipeline", "--help"],
    "drlc check": ["-m", "pipeline", "check"],
}
TARGET_S = {"prepare --help": 0.8, "score --help": 0.8, "critique --help": 0.8, "drlc check": 0.8}  # issue 37


def time_once(tree: Path, args: list[str]) -> float:
    """Seconds of one `python ARGS` in `tree`, importing that tree's pipeline (PYTHONPATH)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], cwd=tree, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"startup: `python {' '.join(args)}` failed in {tree}: {done.stderr.strip()[-300:]}")
    return seconds


def measure(trees: dict[str, Path], repeats: int) -> dict:
    """{tree name: {command: median seconds}}, the trees' runs interleaved command by command."""
    runs = {name: {command: [] for command in COMMANDS} for name in trees}
    for command, args in COMMANDS.items():
        for name, tree in trees.items():
            time_once(tree, args)  # warm the file cache
        for _ in range(repeats):
            for name, tree in trees.items():
                runs[name][command].append(time_once(tree, args))
    return {name: {command: round(statistics.median(times), 3) for command, times in by_command.items()}
            for name, by_command in runs.items()}


def commit(tree: Path) -> str:
    """The checkout's HEAD (uncommitted changes are timed too, and not named here)."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True).stdout.strip()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--baseline-tree", type=Path, help="another checkout to time the same way (e.g. a worktree)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "startup.json")
    args = parser.parse_args(argv)
    trees = {"this_tree": ROOT} | ({"baseline": args.baseline_tree.resolve()} if args.baseline_tree else {})
    medians = measure(trees, args.repeats)
    result = {
        "median_s": medians, "target_s": TARGET_S, "repeats": args.repeats,
        "commits": {name: commit(tree) for name, tree in trees.items()},
        "meets_target": {command: medians["this_tree"][command] <= limit for command, limit in TARGET_S.items()},
        "conditions": {"load_average_1min_after": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
                       "python": platform.python_version()},
    }
    args.out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(json.dumps(result["median_s"], indent=2))
    return result


if __name__ == "__main__":
    main()
