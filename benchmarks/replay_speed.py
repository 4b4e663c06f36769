"""Wall time of `replay` vs the original `dvc repro` run it replays.

Builds a fresh copy of the project (tests/e2e.make_project) with the chosen profile, runs the DAG
in three timed parts: setup (`dvc repro base`: prepare + base), rounds (`dvc repro ppo@<last>`:
rollout, score, critique, ppo of every round) and evaluate (`dvc repro`). Then it times two
replays of that run, each in its own Python process (imports included, as a CLI call would be):
one with unchanged settings, evaluated (checked to reproduce the run's ppo_steps, tokens_per_s
aside, and its metrics/eval.json), and one with new critic reward values and learning rate, once
training only (evaluate=False) and once with the evaluation of the final policy. The critic
requests each replay sent come from its replay.json.

Usage:  python -m benchmarks.replay_speed [--profile demo|tiny] [--keep DIR] [--out FILE]
        (from the checkout root: a module, as it builds the project with tests/e2e.py)
Writes benchmarks/results/replay_speed.json (sorted keys) unless --out. The machine is shared: timings are
single runs, not medians.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from tests.e2e import dvc, make_project, run, tiny_params

ROOT = Path(__file__).resolve().parents[1]

CHANGED = ["critic.rewards.positive=1.0", "critic.rewards.negative=-1.0", "ppo.learning_rate=0.0004"]


def _profile_params(profile: str) -> dict:
    import yaml

    return yaml.safe_load((ROOT / "params.yaml").read_text()) if profile == "demo" else tiny_params(n_rounds=2)


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return round(time.perf_counter() - started, 2)


def _replay(project: Path, out: str, overrides: list[str], *, evaluate: bool) -> dict:
    code = ("import sys; from pipeline.commands.replay import replay; "
            "replay('.', sys.argv[2], overrides=sys.argv[3:], evaluate=sys.argv[1] == 'eval', progress=False)")
    wall = _timed(lambda: run([sys.executable, "-c", code, "eval" if evaluate else "train", out, *overrides], project))
    recorded = json.loads((project / out / "replay.json").read_text())
    return {"overrides": overrides, "wall_s": wall, "inside_s": recorded["seconds"], "evaluated": evaluate,
            "evaluate_s": recorded.get("evaluate_seconds"), "critic_requests": recorded["critic_requests"]}


def _same_ppo_steps(project: Path, out: str, rounds: list[str]) -> bool:
    from pipeline.core import store

    def steps(root: Path, key: str) -> list[dict]:
        rows = store.read_table(store.partition_dir(root / "data", "ppo_steps", int(key)))
        return [{k: v for k, v in row.items() if k != "tokens_per_s"} for row in rows]

    return all(steps(project, key) == steps(project / out, key) for key in rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=["demo", "tiny"], default="demo")
    parser.add_argument("--keep", default=None, help="build the project here instead of a temp dir")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "replay_speed.json"))
    args = parser.parse_args()
    params = _profile_params(args.profile)
    rounds = sorted(params["rounds"])
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.keep) if args.keep else Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        project = make_project(base, params)
        original = {"setup_s": _timed(lambda: dvc(["repro", "-q", "base"], project)),
                    "rounds_s": _timed(lambda: dvc(["repro", "-q", f"ppo@{rounds[-1]}"], project)),
                    "evaluate_s": _timed(lambda: dvc(["repro", "-q"], project))}
        original["total_s"] = round(sum(original.values()), 2)
        same = _replay(project, "replay-same", [], evaluate=True)
        changed = _replay(project, "replay-changed", CHANGED, evaluate=False)
        evaluated = _replay(project, "replay-changed-evaluated", CHANGED, evaluate=True)
        same["reproduces_ppo_steps"] = _same_ppo_steps(project, "replay-same", rounds)
        same["reproduces_eval_json"] = ((project / "metrics" / "eval.json").read_text()
                                        == (project / "replay-same" / "metrics" / "eval.json").read_text())
    result = {
        "profile": args.profile, "rounds": len(rounds), "rollouts_per_round": params["rollout"]["batch_size"],
        "original": original, "replay_same": same, "replay_changed": changed,
        "replay_changed_evaluated": evaluated,
        "speedup_vs_total": round(original["total_s"] / changed["wall_s"], 1),
        "speedup_vs_rounds": round(original["rounds_s"] / changed["wall_s"], 1),
        "speedup_evaluated_vs_rounds_plus_evaluate": round(
            (original["rounds_s"] + original["evaluate_s"]) / evaluated["wall_s"], 1),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "note": "2 shared cores (other jobs running); one run each, not medians"},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(json.dumps(result, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
