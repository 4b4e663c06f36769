"""benchmarks/ppo_update.py's own logic: precisions by CPU, the baseline tree, and a baseline worker that
really imports the other checkout's pipeline."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from benchmarks import ppo_update

ROOT = Path(__file__).resolve().parents[1]


def test_bf16_is_timed_only_where_it_is_native(monkeypatch):
    import pipeline.model.logprobs

    monkeypatch.setattr(pipeline.model.logprobs, "cpu_has_native_bf16", lambda: False)
    assert ppo_update.default_precisions("cpu") == "fp32"
    assert ppo_update.default_precisions("cuda") == "fp32,bf16"
    monkeypatch.setattr(pipeline.model.logprobs, "cpu_has_native_bf16", lambda: True)
    assert ppo_update.default_precisions("cpu") == "fp32,bf16"


def test_a_baseline_tree_that_is_not_a_checkout_is_refused_with_the_fix(tmp_path):
    with pytest.raises(SystemExit, match="git worktree add"):
        ppo_update.baseline_info(tmp_path)
    assert ppo_update.baseline_info(None) is None


def test_a_baseline_worker_imports_the_baseline_trees_pipeline(tmp_path, capfd):
    """A copy of pipeline/ whose trainer refuses to import: the worker must load that copy, not this tree's."""
    shutil.copytree(ROOT / "pipeline", tmp_path / "pipeline")
    (tmp_path / "pipeline" / "train" / "trainer.py").write_text("raise ImportError('the baseline tree was imported')\n")
    with pytest.raises(RuntimeError, match="drlc-baseline-fp32 died"):
        ppo_update.Worker(sys.executable, "drlc", "gpt2-2x128", "fp32", 1, "cpu", tmp_path)
    assert "the baseline tree was imported" in capfd.readouterr().err


def test_an_unknown_precision_is_refused_before_any_worker_starts():
    import subprocess

    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ppo_update.py"), "--precisions", "fp16",
                           "--trl-python", ""], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--precisions fp16: use fp32, bf16 or fp32,bf16" in done.stderr
