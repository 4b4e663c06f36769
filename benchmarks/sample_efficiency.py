"""Do dense critic rewards make PPO more sample-efficient? The drlc issue-10 study as a benchmark.

Per task (sentiment, toxicity, summarization: the demo worlds), seven arms (PPO: sparse; sparse x k, k
matched to dense_all's total reward; dense on every response; dense on low-reward responses only;
dense with zero-mean intrinsic rewards; GRPO with groups of 4: sparse, and dense on every response),
three seeds each, the same rounds x batch rollouts per arm, all run in-process from one cached base model per world, with an environment reward that is
not a re-reading of the critic and the lexicon critic (pipeline/studies/tasks.py
says what each world can and cannot show). Then a zero-cost ablation replays the recorded
dense_all rollouts under other critic settings.

Usage:
  python benchmarks/sample_efficiency.py --quick            # every task, <= 30 min on 2 idle cores
  python benchmarks/sample_efficiency.py --quick --task toxicity   # one task, merged into the JSON
  python benchmarks/sample_efficiency.py                    # the full study (see the results .md)
  python benchmarks/sample_efficiency.py --report-only      # rebuild PNGs + Markdown from the JSON
  python benchmarks/sample_efficiency.py --quick --task sentiment --add-arms grpo_sparse grpo_dense
                                                            # run only these arms, added to the JSON's task
  python benchmarks/sample_efficiency.py --quick --doc docs/results.md   # also splice the section there

Writes benchmarks/results/sample_efficiency[_quick].json ({"tasks": {task: result}}),
<stem>_<task>_curves.png and _frontier.png per task, and benchmarks/results/sample_efficiency.md.
The pretrained base models are cached under --scratch (default: $TMPDIR/drlc-sample-efficiency),
never in the repository.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from pipeline.studies.arms import study_arms  # noqa: E402 (after OMP_NUM_THREADS, read when torch loads)
from pipeline.studies.config import TASKS, preset  # noqa: E402
from pipeline.studies.report import markdown, splice_doc, write_plots  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "benchmarks" / "results"
ARM_NAMES = tuple(study_arms(0.5))


def result_stem(preset_name: str) -> str:
    return "sample_efficiency" if preset_name == "full" else f"sample_efficiency_{preset_name}"


def as_study(loaded: dict) -> dict:
    """A results JSON in the per-task layout {"study", "preset", "tasks": {task: result}}.

    A file written before the per-task layer (one sentiment result at the top level) is wrapped.
    """
    if "tasks" in loaded:
        return loaded
    return {"study": "sample_efficiency", "preset": loaded["preset"], "tasks": {"sentiment": {"task": "sentiment", **loaded}}}


def load_study(out_dir: Path, preset_name: str) -> dict:
    """The preset's results JSON in the per-task layout, or an empty study when there is none yet."""
    path = out_dir / f"{result_stem(preset_name)}.json"
    if not path.is_file():
        return {"study": "sample_efficiency", "preset": preset_name, "tasks": {}}
    return as_study(json.loads(path.read_text()))


def write_outputs(study: dict, out_dir: Path) -> dict:
    """Write each task's PNGs, the JSON (with the image names) and the Markdown made from that JSON; return paths.

    `study` is {"preset", "tasks": {task: result}} (a single task's result is accepted and wrapped).
    The Markdown of the quick and full presets is sample_efficiency.md (the docs/results.md section);
    the smoke preset writes sample_efficiency_smoke.md so a test run never replaces it.
    """
    if "tasks" not in study:
        study = {"study": "sample_efficiency", "preset": study["preset"], "tasks": {study.get("task", "sentiment"): study}}
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = result_stem(study["preset"])
    md_name = "sample_efficiency_smoke.md" if study["preset"] == "smoke" else "sample_efficiency.md"
    for task, result in study["tasks"].items():
        result["images"] = write_plots(result, out_dir, f"{stem}_{task}")
    study["wall_seconds"] = {task: result["wall_seconds"] for task, result in study["tasks"].items()}
    json_path = out_dir / f"{stem}.json"
    json_path.write_text(json.dumps(study, indent=1, sort_keys=True, allow_nan=False) + "\n")
    md_path = out_dir / md_name
    md_path.write_text(markdown(json.loads(json_path.read_text())))
    return {"json": json_path, "markdown": md_path}


def recompute_headlines(study: dict) -> dict:
    """Derived numbers are a pure function of the raw runs: recompute them with the current analysis code."""
    from pipeline.studies.analysis import headline

    for result in study["tasks"].values():
        result["headline"] = headline({arm: data["runs"] for arm, data in result["arms"].items()},
                                      batch_size=result["config"]["batch_size"],
                                      final_window=result["config"]["final_window"])
    return study


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the quick preset (<= 30 min on 2 idle cores)")
    parser.add_argument("--preset", choices=("smoke", "quick", "full"), help="override --quick")
    parser.add_argument("--task", choices=(*TASKS, "all"), default="all",
                        help="run this task only and merge it into the preset's JSON (default: all)")
    parser.add_argument("--scratch", default=str(Path(tempfile.gettempdir()) / "drlc-sample-efficiency"))
    parser.add_argument("--out", default=str(RESULTS), help="results folder")
    parser.add_argument("--report-only", action="store_true",
                        help="recompute the derived numbers from the JSON's raw runs and rebuild PNGs and Markdown")
    parser.add_argument("--doc", help="splice the Markdown section into this page, docs/results.md (between the markers)")
    parser.add_argument("--add-arms", nargs="+", choices=ARM_NAMES, metavar="ARM",
                        help="run only these arms and add them to the task's finished result in the JSON, after "
                             "re-running sparse's first seed to check that result is what this code gives")
    args = parser.parse_args(argv)
    name = args.preset or ("quick" if args.quick else "full")
    out_dir = Path(args.out)
    study = load_study(out_dir, name)
    if args.report_only:
        study = recompute_headlines(study)
    elif args.add_arms:
        from pipeline.studies.study import add_arms

        for task in TASKS if args.task == "all" else (args.task,):
            if task not in study["tasks"]:
                raise SystemExit(f"--add-arms: the {name} JSON has no {task} result yet: run the task without it")
            add_arms(study["tasks"][task], preset(name, task), args.add_arms, scratch=args.scratch)
            write_outputs(recompute_headlines(study), out_dir)
    else:
        from pipeline.studies.study import run_study

        Path(args.scratch).mkdir(parents=True, exist_ok=True)
        for task in TASKS if args.task == "all" else (args.task,):
            started = time.perf_counter()
            study["tasks"][task] = run_study(preset(name, task), scratch=args.scratch)
            print(f"[{task}] wall time: {time.perf_counter() - started:.0f} s (the machine was shared, so this is "
                  "pessimistic)", flush=True)
            write_outputs(study, out_dir)  # after every task, so a later failure keeps the finished ones
    paths = write_outputs(study, out_dir)
    print(f"wrote {paths['json']} and {paths['markdown']}")
    if args.doc:
        splice_doc(args.doc, paths["markdown"].read_text())
        print(f"spliced the results section into {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
