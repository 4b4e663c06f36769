"""Do dense critic rewards make PPO more sample-efficient? The drlc issue-10 study as a benchmark.

Five arms (sparse; sparse x k, k matched to dense_all's mean total reward; dense on every
response; dense on low-reward responses only; dense with zero-mean intrinsic rewards), several
seeds each, the same rounds x batch rollouts per arm, all run in-process from one cached base
model on the synthetic review world, with a classifier environment reward and the lexicon critic
(benchmarks/sample_efficiency_lib/world.py says what this world can and cannot show). Then a
zero-cost ablation replays the recorded dense_all rollouts under other critic settings.

Usage:
  python benchmarks/sample_efficiency.py --quick            # <= 30 min on 2 idle cores
  python benchmarks/sample_efficiency.py                    # the full study (see the results .md)
  python benchmarks/sample_efficiency.py --report-only      # rebuild PNGs + Markdown from the JSON
  python benchmarks/sample_efficiency.py --quick --readme README.md   # also splice the section into README

Writes benchmarks/results/sample_efficiency[_quick].json, _curves.png, _frontier.png and
benchmarks/results/sample_efficiency.md. The pretrained base model is cached under --scratch
(default: $TMPDIR/drlc-sample-efficiency), never in the repository.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.sample_efficiency_lib.config import preset  # noqa: E402
from benchmarks.sample_efficiency_lib.report import markdown, splice_readme, write_plots  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def result_stem(preset_name: str) -> str:
    return "sample_efficiency" if preset_name == "full" else f"sample_efficiency_{preset_name}"


def write_outputs(result: dict, out_dir: Path) -> dict:
    """Write the PNGs, the JSON (with the image names) and the Markdown made from that JSON; return paths.

    The Markdown of the quick and full presets is sample_efficiency.md (the README section);
    the smoke preset writes sample_efficiency_smoke.md so a test run never replaces it.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = result_stem(result["preset"])
    md_name = "sample_efficiency_smoke.md" if result["preset"] == "smoke" else "sample_efficiency.md"
    result["images"] = write_plots(result, out_dir, stem)
    json_path = out_dir / f"{stem}.json"
    json_path.write_text(json.dumps(result, indent=1, sort_keys=True, allow_nan=False) + "\n")
    md_path = out_dir / md_name
    md_path.write_text(markdown(json.loads(json_path.read_text())))
    return {"json": json_path, "markdown": md_path}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the quick preset (<= 30 min on 2 idle cores)")
    parser.add_argument("--preset", choices=("smoke", "quick", "full"), help="override --quick")
    parser.add_argument("--scratch", default=str(Path(tempfile.gettempdir()) / "drlc-sample-efficiency"))
    parser.add_argument("--out", default=str(RESULTS), help="results folder")
    parser.add_argument("--report-only", action="store_true",
                        help="recompute the derived numbers from the JSON's raw runs and rebuild PNGs and Markdown")
    parser.add_argument("--readme", help="splice the Markdown section into this README (between the markers)")
    args = parser.parse_args(argv)
    name = args.preset or ("quick" if args.quick else "full")
    out_dir = Path(args.out)
    if args.report_only:
        from benchmarks.sample_efficiency_lib.analysis import headline

        result = json.loads((out_dir / f"{result_stem(name)}.json").read_text())
        # derived numbers are a pure function of the raw runs: recompute them with the current analysis code
        result["headline"] = headline({arm: data["runs"] for arm, data in result["arms"].items()},
                                      batch_size=result["config"]["batch_size"],
                                      final_window=result["config"]["final_window"])
    else:
        from benchmarks.sample_efficiency_lib.study import run_study

        Path(args.scratch).mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        result = run_study(preset(name), scratch=args.scratch)
        print(f"wall time: {time.perf_counter() - started:.0f} s ({(time.perf_counter() - started) / 60:.1f} min; "
              "the machine was shared, so this is pessimistic)")
    paths = write_outputs(result, out_dir)
    print(f"wrote {paths['json']} and {paths['markdown']}")
    if args.readme:
        splice_readme(args.readme, paths["markdown"].read_text())
        print(f"spliced the results section into {args.readme}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
