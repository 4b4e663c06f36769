"""docs/results.md's CommonGen block: the `drlc study` report of configs/commongen.yaml, as committed JSON.

`drlc study` writes report.json into its --out folder; this script records it with its provenance
(the grid asked for, how many experiments are in, the machine) in benchmarks/results/study_commongen.json,
and with --doc splices `render` of that JSON, and only that JSON, into the page between BLOCK_START and
BLOCK_END. tests/test_study_commongen.py renders it again from the committed JSON and compares.

Usage (a clone of this repo with params.yaml = configs/commongen.yaml, committed):
    drlc study --arms sparse dense sparse_scaled sparse_lowkl dense_scaled --seeds 0 1 2 3 4 \
        --metric world/coverage --out study/commongen
    python benchmarks/study_commongen.py --report <clone>/study/commongen/report.json --doc docs/results.md
While the grid still runs, the same `drlc study` line with --report-only (and another --out) reports what has
finished without touching the queue; the JSON counts those experiments against GRID. The grid before the
fair-answer changes (summed, random and the GRPO pair, end points only, dense_scaled critiquing at the scaled
threshold) is in this file's git history (commit 5ad2d09).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
from datetime import date
from pathlib import Path

from pipeline.studies import generated_blocks
from pipeline.studies.study_report import markdown, versus_best_control

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "study_commongen.json"
BLOCK_START = "<!-- commongen-study:start -->"
BLOCK_END = "<!-- commongen-study:end -->"
PPO_ARMS = ["sparse", "dense", "sparse_scaled", "sparse_lowkl", "dense_scaled"]  # the two matched controls, and dense
GRID = {"ppo": {"arms": PPO_ARMS, "seeds": [0, 1, 2, 3, 4]}}  # on top of the larger one


def record(reports: list[dict]) -> dict:
    """The committed JSON: the reports and where they stand against the grid."""
    planned = sum(len(g["arms"]) * len(g["seeds"]) for g in GRID.values())
    done = sum(len(arm["seeds"]) for report in reports for arm in report["arms"].values())
    return {"reports": [{k: v for k, v in r.items() if k != "project"} for r in reports], "grid": GRID,
            "experiments_done": done, "experiments_planned": planned,
            "measured": {"date": date.today().isoformat(), "cpus": os.cpu_count(), "machine": platform.machine()}}


def render(result: dict) -> str:
    """The block of docs/results.md from the committed JSON: dense against the better matched control, then the
    full reports."""
    done, planned = result["experiments_done"], result["experiments_planned"]
    status = "complete" if done >= planned else f"in progress: {done} of {planned} experiments"
    head = (f"configs/commongen.yaml through `drlc study` ({status}; measured {result['measured']['date']} on a "
            f"{result['measured']['cpus']}-core CPU machine).\n")
    tables = [headline(r) + markdown(r, f"CommonGen: {', '.join(r['arms'])} × seeds {r['seeds']}")
              .replace("## ", "#### ", 1) for r in result["reports"]]
    return "\n".join([head, *tables])


def headline(report: dict) -> str:
    """One line: dense − the better of sparse_scaled and sparse_lowkl, at matched KL and at the end point."""
    if "dense" not in report["arms"]:
        return ""
    row = versus_best_control(report)
    if row["control"] is None:
        return ""
    parts = [f"{name} {d['mean']:+.3f}" + (f" ± {d['half']:.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"
                                           if d.get("half") is not None else " (1 seed)")
             for name, d in (("at matched KL", row["at_kl"]), ("at the end point", row["end"])) if d]
    return (f"**dense − {row['control']}** (the better matched control at the end point), "
            f"{report['metric']}: {'; '.join(parts)}.\n\n")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, nargs="+", required=True,
                        help="report.json files that `drlc study` wrote")
    parser.add_argument("--out", type=Path, default=RESULT)
    parser.add_argument("--doc", type=Path, default=None, help="splice the block into this page (docs/results.md)")
    args = parser.parse_args(argv)
    result = record([json.loads(path.read_text()) for path in args.report])
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    if args.doc:
        generated_blocks.splice_file(args.doc, render(result), BLOCK_START, BLOCK_END)
    print(render(result))
    return result


if __name__ == "__main__":
    main()
