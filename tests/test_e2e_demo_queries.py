"""The demo numbers of docs/results.md stay true: run the default demo (params.yaml unchanged) with the real
DVC, run its queries on it with benchmarks/demo_queries.py, and compare every row with the committed
benchmarks/results/demo_queries.json (which docs/results.md renders, tests/test_readme_queries.py).

The rows depend on torch's thread count and the CPU's kernels (summation order), so the comparison
runs where both equal the committed run's and skips, saying so, elsewhere. On a mismatch the fresh result is
left in the test's temp folder with the command that re-renders docs/results.md from it.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from e2e import dvc, make_project

from benchmarks.demo_queries import RESULT, provenance, run_queries

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow  # the full demo: 4 rounds of 128 rollouts, a few minutes on 2 cores


def stage_threads() -> int:
    """torch's thread count in a fresh process, as the demo's stages get it (an earlier test in this
    pytest process may have lowered this process's own count with torch.set_num_threads)."""
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                         capture_output=True, text=True, check=True)
    return int(out.stdout)


def test_a_fresh_demo_run_gives_the_committed_demo_queries(tmp_path):
    committed = json.loads(RESULT.read_text())
    threads = committed["provenance"]["torch_threads"]
    if stage_threads() != threads:
        pytest.skip(f"torch runs {stage_threads()} threads in a stage process here, the committed run {threads}: "
                    f"the demo's floats (and so its rollouts) differ by summation order")
    # "AMD EPYC" names every EPYC generation in a VM: CI once ran this test on one whose kernels
    # gave other rows than the committed run's, with the code that made them unchanged
    here, then = provenance(ROOT)["machine"], committed["provenance"]["machine"]
    for key in ("cpu", "torch_cpu_capability", "cpu_isa"):
        if here[key] != then.get(key):
            pytest.skip(f"this CPU's {key} is {here[key]!r}, the committed run's {then.get(key)!r}: "
                        f"its kernels sum in another order")
    project = make_project(tmp_path, yaml.safe_load((ROOT / "params.yaml").read_text()))
    dvc(["repro"], project)
    fresh = run_queries(project)
    (tmp_path / "demo_queries.json").write_text(json.dumps(fresh, indent=1) + "\n")
    fix = (f"a code change moved the demo numbers of docs/results.md: python benchmarks/demo_queries.py "
           f"--project {project} --doc docs/results.md (fresh rows in {tmp_path / 'demo_queries.json'})")
    for new, old in zip(fresh["queries"], committed["queries"], strict=True):
        assert (new["key"], new["columns"], new["rows"]) == (old["key"], old["columns"], old["rows"]), fix
