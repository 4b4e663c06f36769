"""Check `drlc estimate`'s run time against measured `dvc repro` stage times (issue 29, item 7).

For each profile: a temp copy of the repository (git archive of HEAD + the working tree's
estimate code, a fresh git repo) with the profile as params.yaml and `rounds` cut to --rounds; then
`dvc repro -s <stage>` for every stage in dvc.yaml order, each timed (wall seconds, DVC's own
overhead included: that is what a user waits for). The per-round stages (rollout, score,
critique, ppo) are summed per round and set beside the estimate's per-round time, with the stated
assumptions and with --calibrate (measured on this machine). prepare, base and evaluate run once
and are reported but not compared (the estimate counts the training rounds only).

Run (heavy: wrap it in the shared lock on a shared machine):
    flock /tmp/drlc-heavy.lock python benchmarks/estimate_check.py --profiles params.yaml --rounds 2
Writes benchmarks/results/estimate_check.json. Target: estimate within 2x of measured.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
ROUND_STAGES = ("rollout", "score", "critique", "ppo")


def sh(cmd: list[str], cwd: Path, env: dict | None = None) -> str:
    done = subprocess.run(cmd, check=False, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed in {cwd}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return done.stdout


def project_copy(profile: str, rounds: int, dest: Path) -> Path:
    """The repository's files (tracked + untracked, not ignored) in DEST with PROFILE as params.yaml, ROUNDS rounds."""
    files = sh(["git", "ls-files", "-co", "--exclude-standard"], REPO).split("\n")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    params = yaml.safe_load((REPO / profile).read_text())
    keys = sorted(params["rounds"])[:rounds]
    params["rounds"] = {k: params["rounds"][k] for k in keys}
    params.setdefault("evaluate", {})["policy"] = f"round={keys[-1]}"
    (dest / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-qm", "bench"]):
        sh(cmd, dest)
    return dest


def stage_names(project: Path) -> list[str]:
    out = sh([sys.executable, "-m", "dvc", "stage", "list", "--name-only"], project, env=_env(project))
    names = [line.strip() for line in out.splitlines() if line.strip()]
    return sorted(names, key=_run_order)


def _run_order(name: str) -> tuple:
    """prepare, base, then round by round rollout, score, critique, ppo, then the rest (evaluate)."""
    family, _, key = name.partition("@")
    if family in ("prepare", "base"):
        return (0, family == "base", "")
    if family in ROUND_STAGES:
        return (1, key, ROUND_STAGES.index(family))
    return (2, key, family)


def _env(project: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(project)}


def measure(project: Path) -> dict[str, float]:
    """{stage: wall seconds of `dvc repro -s stage`} in dvc.yaml's order."""
    times = {}
    for name in stage_names(project):
        if name.startswith("chunk"):
            continue
        start = time.perf_counter()
        sh([sys.executable, "-m", "dvc", "repro", "-s", name], project, env=_env(project))
        times[name] = time.perf_counter() - start
        print(f"  {name}: {times[name]:.1f} s", flush=True)
    return times


def per_round(times: dict[str, float]) -> dict[str, dict[str, float]]:
    """{round key: {stage family: seconds}} of the per-round stages."""
    rounds: dict[str, dict[str, float]] = {}
    for name, seconds in times.items():
        family, _, key = name.partition("@")
        if family in ROUND_STAGES and key:
            rounds.setdefault(key, {})[family] = seconds
    return rounds


def estimated(project: Path, calibrate: bool) -> dict:
    """`drlc estimate params.yaml [--calibrate]` in PROJECT: its per-round stage seconds and assumptions line."""
    cmd = [sys.executable, "-m", "pipeline", "estimate", "params.yaml"] + (["--calibrate"] if calibrate else [])
    out = sh(cmd, project, env=_env(project)).split("== run time", 1)[1]
    per_round = re.search(r"per round: (.+)", out)[1]
    stages = {name: float(seconds) for name, seconds in re.findall(r"(\w+) ([\d.]+) s", per_round)}
    return {"stages": stages, "round_s": sum(stages.values()),
            "assumptions": re.search(r"assumptions: (.+)", out)[1]}


def check(profile: str, rounds: int, keep: bool, times: dict | None = None) -> dict:
    """Estimate (stated and calibrated) and measure PROFILE; TIMES = stage seconds measured before (no dvc run)."""
    tmp = Path(tempfile.mkdtemp(prefix="drlc-estimate-check-"))
    try:
        project = project_copy(profile, rounds, tmp)
        print(f"{profile}: {rounds} rounds in {project}", flush=True)
        stated = estimated(project, calibrate=False)
        calibrated = estimated(project, calibrate=True)
        times = times or measure(project)
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    by_round = per_round(times)
    measured_round = sum(sum(r.values()) for r in by_round.values()) / len(by_round)
    row = {"profile": profile, "rounds": rounds, "stage_seconds": times,
           "measured_round_s": measured_round,
           "estimate_round_s": stated["round_s"], "estimate_calibrated_round_s": calibrated["round_s"],
           "ratio": stated["round_s"] / measured_round, "ratio_calibrated": calibrated["round_s"] / measured_round,
           "estimate": stated, "estimate_calibrated": calibrated}
    row["within_2x"] = 0.5 <= row["ratio"] <= 2.0
    row["within_2x_calibrated"] = 0.5 <= row["ratio_calibrated"] <= 2.0
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", nargs="+", default=["params.yaml"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the temp projects")
    parser.add_argument("--times", help="reuse the stage_seconds of this earlier result file (no dvc run)")
    parser.add_argument("--measure-only", action="store_true", help="only run and time the stages")
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/estimate_check.json"))
    args = parser.parse_args()
    if args.measure_only:
        measured = {}
        for profile in args.profiles:
            tmp = Path(tempfile.mkdtemp(prefix="drlc-estimate-check-"))
            measured[profile] = measure(project_copy(profile, args.rounds, tmp))
            shutil.rmtree(tmp, ignore_errors=True)
        Path(args.out).write_text(json.dumps({"stage_seconds": measured}, indent=2) + "\n")
        return
    before = json.loads(Path(args.times).read_text())["stage_seconds"] if args.times else {}
    rows = [check(p, args.rounds, args.keep, before.get(p)) for p in args.profiles]
    result = {"machine": {"cpus": os.cpu_count(), "loadavg_end": os.getloadavg()}, "profiles": rows}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for r in rows:
        print(f"{r['profile']}: measured {r['measured_round_s']:.1f} s/round; estimate {r['estimate_round_s']:.1f} s "
              f"(x{r['ratio']:.2f}), calibrated {r['estimate_calibrated_round_s']:.1f} s (x{r['ratio_calibrated']:.2f})")


if __name__ == "__main__":
    main()
