"""docs/results.md's length sweep: `drlc study` at several response lengths, dense against the best matched control.

Each length is one `drlc study` grid (arms sparse, dense, random, sparse_scaled, sparse_lowkl) in a project whose
params.yaml differs only in ``rollout.max_new_tokens`` (and ``evaluate.max_new_tokens``), passed as ``-S``, so
the grid's experiments are checked against it (study.mismatch). This script records their report.json files
with their provenance in benchmarks/results/study_length_<name>.json, and renders from that JSON alone the
sweep table (pipeline.studies.study_report.versus_best_control per length), a PNG of it and, with --doc, the
block of docs/results.md between the markers. tests/test_study_length.py renders it again and compares.

Usage (one project per length, e.g. clones of this repo with params.yaml = configs/commongen-paragraph.yaml):
    drlc study --arms sparse dense random sparse_scaled sparse_lowkl --seeds 0 1 2 3 4 --metric world/coverage \
        -S rollout.max_new_tokens=64 -S evaluate.max_new_tokens=64 --out study/len64
    python benchmarks/study_length.py --name commongen --report 24=<p24>/study/len24/report.json \
        64=<p64>/study/len64/report.json --doc docs/results.md
"""
from __future__ import annotations

import argparse
import json
import os
import platform
from datetime import date
from pathlib import Path

from pipeline.studies import generated_blocks
from pipeline.studies.study_report import markdown, plot_sweep, sweep_markdown, versus_best_control

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
KEY = "rollout.max_new_tokens"


def markers(name: str) -> tuple[str, str]:
    return f"<!-- length-sweep-{name}:start -->", f"<!-- length-sweep-{name}:end -->"


def record(reports: dict[str, dict], *, name: str, note: str = "", measured_on: date | None = None) -> dict:
    """The committed JSON: each length's report (local paths dropped), the day the last grid finished (today
    unless given) and the machine it ran on."""
    day = (measured_on or date.today()).isoformat()
    return {"name": name, "key": KEY, "note": note,
            "reports": {length: {k: v for k, v in r.items() if k != "project"} for length, r in reports.items()},
            "measured": {"date": day, "cpus": os.cpu_count(), "machine": platform.machine()}}


def rows(result: dict) -> dict[str, dict]:
    """versus_best_control of each length, in length order."""
    by_length = sorted(result["reports"].items(), key=lambda item: float(item[0]))
    return {length: versus_best_control(report) for length, report in by_length}


def render(result: dict) -> str:
    """The block of docs/results.md from the committed JSON: the sweep table, then each length's report."""
    metric = next(iter(result["reports"].values()))["metric"]
    head = (f"`drlc study` per response length ({result['key']}; measured {result['measured']['date']} on a "
            f"{result['measured']['cpus']}-core CPU machine). {result['note']}".rstrip() + "\n")
    grids = [markdown(r, f"{result['name']}, {result['key']} = {length}: {', '.join(r['arms'])}")
             .replace("## ", "#### ", 1) for length, r in sorted(result["reports"].items(), key=lambda i: float(i[0]))]
    return "\n".join([head, sweep_markdown(rows(result), result["key"], metric), *grids])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, help="the sweep's name: its JSON, PNG and block in the page")
    parser.add_argument("--report", nargs="+", required=True, metavar="LENGTH=REPORT",
                        help="each length's report.json that `drlc study` wrote")
    parser.add_argument("--note", default="", help="one sentence on what the grids are (task, rounds, budget)")
    parser.add_argument("--doc", type=Path, default=None, help="splice the block into this page (docs/results.md)")
    args = parser.parse_args(argv)
    reports, finished = {}, []
    for item in args.report:
        length, _, path = item.partition("=")
        reports[length] = json.loads(Path(path).read_text())
        finished.append(date.fromtimestamp(Path(path).stat().st_mtime))
    result = record(reports, name=args.name, note=args.note, measured_on=max(finished))
    plot_sweep(rows(result), KEY, next(iter(reports.values()))["metric"], RESULTS / f"study_length_{args.name}.png")
    generated_blocks.publish(result, RESULTS / f"study_length_{args.name}.json", render(result), args.doc,
                             *markers(args.name))
    return result


if __name__ == "__main__":
    main()
