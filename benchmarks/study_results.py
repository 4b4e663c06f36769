"""docs/results.md's `drlc study` blocks: each study's report.json, as committed JSON, rendered by one renderer.

`drlc study` writes report.json into its --out folder; this script records it with its provenance (the grid
asked for, how many experiments are in, the machine) in benchmarks/results/study_<name>.json, and with --doc
splices `render` of that JSON, and only that JSON, into the page between the study's markers
(``<!-- <name>-study:start -->`` .. ``:end -->``). The tables are pipeline/studies/study_report.py's `markdown`,
the one report renderer; a study whose arms read different critics (detox, the real-text study) adds each critic
arm's gain beside the critic's char F1, recorded in the JSON from benchmarks/results/study_critics.json.
tests/test_study_results.py renders every block again from the committed JSON and compares.

Usage (a clone of this repo with params.yaml = the study's profile, STUDIES[name]["profile"], committed):
    drlc study --arms <the grid's arms> --seeds <its seeds> --metric <its metric> --out study/<name>
    python benchmarks/study_results.py --name <name> --report <clone>/study/<name>/report.json --doc docs/results.md
While the grid still runs, the same `drlc study` line with --report-only (and another --out) reports what has
finished without touching the queue; the JSON counts those experiments against the grid. CommonGen's grid
before the fair-answer changes (summed, random and the GRPO pair, end points only, dense_scaled critiquing at the
scaled threshold) is in this file's git history (benchmarks/study_commongen.py, commit 5ad2d09).
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
RESULTS = ROOT / "benchmarks" / "results"
SYNTHETIC_ARMS = ["sparse", "dense", "dense_zero_mean", "sparse_scaled", "sparse_lowkl", "grpo_sparse", "grpo_dense"]
STUDIES = {  # name: the profile, the grid asked for, and the title of its tables
    "commongen": {"profile": "configs/commongen.yaml", "title": "CommonGen",
                  "grid": {"arms": ["sparse", "dense", "sparse_scaled", "sparse_lowkl", "dense_scaled"],
                           "seeds": [0, 1, 2, 3, 4]}},
    "sentiment": {"profile": "configs/study-sentiment.yaml", "title": "Synthetic sentiment world",
                  "grid": {"arms": SYNTHETIC_ARMS, "seeds": [0, 1, 2]}},
    "toxicity": {"profile": "configs/study-toxicity.yaml", "title": "Synthetic toxicity world",
                 "grid": {"arms": SYNTHETIC_ARMS, "seeds": [0, 1, 2]}},
    "summarization": {"profile": "configs/study-summarization.yaml", "title": "Synthetic summarization world",
                      "grid": {"arms": SYNTHETIC_ARMS, "seeds": [0, 1, 2]}},
    "detox": {"profile": "configs/study-detox.yaml", "title": "Real text: RealToxicityPrompts, SmolLM2-135M LoRA",
                  "grid": {"arms": ["sparse", "dense", "random", "sparse_scaled", "dense_lexicon", "dense_smol_copy",
                                    "dense_smol_text", "grpo_sparse", "grpo_dense", "grpo_random"],
                           "seeds": [0, 1, 2]},
                  # the critic each dense arm reads on that profile (its `dense` is the distilled tagger)
                  "critics": {"dense": "tagger", "random": "random", "dense_lexicon": "lexicon",
                              "dense_smol_copy": "smol_copy", "dense_smol_text": "smol_text", "grpo_dense": "tagger",
                              "grpo_random": "random"}},
}
CRITIC_QUALITY = RESULTS / "study_critics.json"  # each critic's char F1 on the SemEval-2021 trial posts


def result_path(name: str) -> Path:
    return RESULTS / f"study_{name}.json"


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}-study:start -->", f"<!-- {name}-study:end -->"


def record(reports: list[dict], name: str) -> dict:
    """The committed JSON: the reports and where they stand against the study's grid."""
    study = STUDIES[name]
    planned = len(study["grid"]["arms"]) * len(study["grid"]["seeds"])
    done = sum(len(arm["seeds"]) for report in reports for arm in report["arms"].values())
    quality = {}
    if "critics" in study:  # recorded with the result, so the block renders from this JSON alone
        measured = json.loads(CRITIC_QUALITY.read_text())["critics"]
        quality = {critic: measured[critic]["char_f1"] for critic in sorted(set(study["critics"].values()))}
    return {"name": name, "profile": study["profile"],
            "reports": [{k: v for k, v in r.items() if k != "project"} for r in reports], "grid": study["grid"],
            "experiments_done": done, "experiments_planned": planned,
            "measured": {"date": date.today().isoformat(), "cpus": os.cpu_count(), "machine": platform.machine()}} \
        | ({"critic_char_f1": quality} if quality else {})


def render(result: dict) -> str:
    """The block of docs/results.md from the committed JSON: dense against the better matched control, then the
    full reports."""
    done, planned = result["experiments_done"], result["experiments_planned"]
    status = "complete" if done >= planned else f"in progress: {done} of {planned} experiments"
    study = STUDIES[result["name"]]
    head = (f"{study['profile']} through `drlc study` ({status}; measured {result['measured']['date']} on a "
            f"{result['measured']['cpus']}-core CPU machine).\n")
    tables = [headline(r) + markdown(r, f"{study['title']}: {', '.join(r['arms'])} × seeds {r['seeds']}")
              .replace("## ", "#### ", 1) + critic_quality(r, study.get("critics", {}), result.get("critic_char_f1"))
              for r in result["reports"]]
    return "\n".join([head, *tables])


def control_of(arm: str) -> str:
    """What a critic's arm is measured against: its algorithm's scale-free sparse arm (grpo_sparse: GRPO's group
    normalisation cancels any scale), else sparse_scaled."""
    return "grpo_sparse" if arm.startswith("grpo_") else "sparse_scaled"


def critic_quality(report: dict, critics: dict[str, str], char_f1: dict[str, float] | None) -> str:
    """The gain against critic quality: each critic arm minus its control (:func:`control_of`) at matched KL and
    at the end point, beside the critic's char F1 ("" for a study without critics, or with none of their arms)."""
    rows = []
    for arm, critic in critics.items():
        pair = f"{arm}-{control_of(arm)}"
        if arm not in report["arms"] or pair not in report["differences"]:
            continue
        at_kl, end = (report.get("matched_kl") or {}).get(pair), report["differences"][pair].get(report["metric"])
        cells = [arm, critic, f"{char_f1[critic]:.3f}", control_of(arm)]
        cells += ["-" if d is None else f"{d['mean']:+.3f}" + ("" if d["half"] is None else f" ± {d['half']:.3f}")
                  for d in (at_kl, end)]
        rows.append("| " + " | ".join(cells) + " |")
    if not rows:
        return ""
    return "\n".join(["", f"Gain against critic quality ({report['metric']}; char F1 on the SemEval-2021 trial posts, "
                       "benchmarks/results/study_critics.json):", "",
                       "| arm | critic | char F1 | minus | at matched KL | at the end point |",
                       "|---|---|---|---|---|---|", *rows]) + "\n"


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
    parser.add_argument("--name", required=True, choices=sorted(STUDIES), help="the study (its grid and block)")
    parser.add_argument("--report", type=Path, nargs="+", required=True,
                        help="report.json files that `drlc study` wrote")
    parser.add_argument("--out", type=Path, default=None, help="the JSON (default: results/study_NAME.json)")
    parser.add_argument("--doc", type=Path, default=None, help="splice the block into this page (docs/results.md)")
    args = parser.parse_args(argv)
    result = record([json.loads(path.read_text()) for path in args.report], args.name)
    generated_blocks.publish(result, args.out or result_path(args.name), render(result), args.doc,
                             *markers(args.name))
    return result


if __name__ == "__main__":
    main()
