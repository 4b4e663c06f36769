"""Check `drlc estimate`'s run time against measured `dvc repro` stage times (issue 29, item 7).

For each profile: a temp copy of the repository (its tracked and untracked files, a fresh git
repo; ../shared linked beside it) with the profile as params.yaml and `rounds` cut to --rounds; then
`dvc repro -s <stage>` for every stage in dvc.yaml order, each timed (wall seconds, DVC's own
overhead included: that is what a user waits for), with the 1-minute load average after it (the
machine is shared: a busy one stretches every stage). Each per-round stage (rollout, score,
critique, ppo) is averaged over the rounds and set beside the estimate's seconds for it, with the
stated assumptions and with --calibrate (measured on this machine); `within_2x` is per stage, and
the round's sum is compared too. prepare, base, distill and evaluate run once and are reported but
not compared (the estimate counts the training rounds only).

Run (heavy: wrap it in the shared lock on a shared machine):
    flock /tmp/drlc-heavy.lock python benchmarks/estimate_check.py --profiles params.yaml --rounds 2
or in two steps (measure each profile alone, then estimate against the measured times):
    flock /tmp/drlc-heavy.lock python benchmarks/estimate_check.py --measure-only --profiles P --out T.json
    flock /tmp/drlc-heavy.lock python benchmarks/estimate_check.py --profiles P ... --times T.json [T2.json]
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


def project_copy(profile: str, rounds: int, tmp: Path) -> Path:
    """The repository's files (tracked + untracked, not ignored) in TMP/project with PROFILE as params.yaml, ROUNDS
    rounds; TMP/shared links to the repository's ../shared, so the profiles' ../shared/data paths resolve."""
    dest = tmp / "project"
    dest.mkdir()
    if (REPO.parent / "shared").is_dir():
        (tmp / "shared").symlink_to(REPO.parent / "shared")
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
    """prepare, base and the other once-per-run inputs (distill@<key>: a tagger critic), then round by round
    rollout, score, critique, ppo, then evaluate."""
    family, _, key = name.partition("@")
    if family in ROUND_STAGES:
        return (1, key, ROUND_STAGES.index(family))
    if family == "evaluate":
        return (2, key, family)
    return (0, ("prepare", "base").index(family) if family in ("prepare", "base") else 2, name)


def _env(project: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(project)}


def measure(project: Path) -> tuple[dict[str, float], dict[str, float]]:
    """({stage: wall seconds of `dvc repro -s stage`}, {stage: 1-minute load average after it}) in run order."""
    times, load = {}, {}
    for name in stage_names(project):
        if name.startswith("chunk"):
            continue
        start = time.perf_counter()
        sh([sys.executable, "-m", "dvc", "repro", "-s", name], project, env=_env(project))
        times[name], load[name] = time.perf_counter() - start, os.getloadavg()[0]
        print(f"  {name}: {times[name]:.1f} s (load {load[name]:.2f})", flush=True)
    return times, load


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


def check(profile: str, rounds: int, keep: bool, measured: dict | None = None, calibrate: bool = True) -> dict:
    """Estimate (stated and calibrated) and measure PROFILE; MEASURED = an earlier --measure-only entry (no dvc run)."""
    tmp = Path(tempfile.mkdtemp(prefix="drlc-estimate-check-"))
    try:
        project = project_copy(profile, rounds, tmp)
        print(f"{profile}: {rounds} rounds in {project}", flush=True)
        stated = estimated(project, calibrate=False)
        calibrated = estimated(project, calibrate=True) if calibrate else None
        if measured is None:
            times, load = measure(project)
            measured = {"stage_seconds": times, "loadavg_1min": load, "measured_now": True}
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    by_round = per_round(measured["stage_seconds"])
    mean = {stage: sum(r[stage] for r in by_round.values()) / len(by_round) for stage in ROUND_STAGES}
    row = {"profile": profile, "rounds": rounds, **measured, "measured_stage_mean_s": mean,
           "measured_round_s": sum(mean.values())}
    for name, estimate in (("stated", stated), ("calibrated", calibrated)):
        if estimate is None:
            row[name] = "not run (--stated-only)"
            continue
        ratios = {stage: estimate["stages"][stage] / mean[stage] for stage in ROUND_STAGES}
        row[name] = {**estimate, "stage_ratio": ratios,
                     "round_ratio": estimate["round_s"] / row["measured_round_s"],
                     "within_2x_every_stage": all(0.5 <= r <= 2.0 for r in ratios.values())}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", nargs="+", default=["params.yaml"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the temp projects")
    parser.add_argument("--times", nargs="*", default=[],
                        help="reuse the measured stages of these --measure-only files (no dvc run for their profiles)")
    parser.add_argument("--measure-only", action="store_true", help="only run and time the stages")
    parser.add_argument("--stated-only", action="store_true", help="skip --calibrate (seconds instead of a minute)")
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/estimate_check.json"))
    args = parser.parse_args()
    if args.measure_only:
        measured = {}
        for profile in args.profiles:
            tmp = Path(tempfile.mkdtemp(prefix="drlc-estimate-check-"))
            times, load = measure(project_copy(profile, args.rounds, tmp))
            measured[profile] = {"stage_seconds": times, "loadavg_1min": load, "commit": _commit(),
                                 "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            shutil.rmtree(tmp, ignore_errors=True)
        Path(args.out).write_text(json.dumps({"measured": measured}, indent=2) + "\n")
        return
    before = {p: m for f in args.times for p, m in json.loads(Path(f).read_text())["measured"].items()}
    rows = [check(p, args.rounds, args.keep, before.get(p), not args.stated_only) for p in args.profiles]
    result = {"machine": {"cpus": os.cpu_count(), "loadavg_end": os.getloadavg()}, "commit": _commit(),
              "profiles": rows}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for r in rows:
        for name in ("stated", "calibrated"):
            e = r[name]
            if isinstance(e, str):
                continue
            print(f"{r['profile']} {name}: round {e['round_s']:.1f} s vs measured {r['measured_round_s']:.1f} s; "
                  + ", ".join(f"{s} x{e['stage_ratio'][s]:.2f}" for s in ROUND_STAGES)
                  + f"; every stage within 2x: {e['within_2x_every_stage']}")


def _commit() -> str:
    return sh(["git", "rev-parse", "--short", "HEAD"], REPO).strip()


if __name__ == "__main__":
    main()
