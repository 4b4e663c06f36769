"""benchmarks/ppo_update.py's own logic: precisions by CPU, the baseline tree, and a baseline worker that
really imports the other checkout's pipeline (a real worker process: slow; the command and path it is
given are checked in the unit tier)."""
from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

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


class FakeWorkerProcess:
    """subprocess.Popen for Worker: records what it was given; its stdout is `lines`."""
    started: list[dict] = []
    lines = ""

    def __init__(self, cmd, **kwargs):
        FakeWorkerProcess.started.append({"cmd": cmd, **kwargs})
        self.stdout, self.returncode = io.StringIO(self.lines), 3

    def wait(self, timeout=None):
        return self.returncode


def test_a_worker_is_this_script_with_the_chosen_tree_first_on_its_path(tmp_path, monkeypatch):
    monkeypatch.setattr(ppo_update, "subprocess", SimpleNamespace(Popen=FakeWorkerProcess, PIPE=subprocess.PIPE))
    monkeypatch.setattr(FakeWorkerProcess, "started", [])
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setattr(FakeWorkerProcess, "lines", '{"ready": true}\n')
    worker = ppo_update.Worker("py", "drlc", "gpt2-2x128", "bf16", 2, "cpu", tmp_path)
    baseline, = FakeWorkerProcess.started
    assert worker.name == "drlc-baseline-bf16" and baseline["cmd"] == [
        "py", str(ROOT / "benchmarks" / "ppo_update.py"), "--worker", "drlc", "--shape", "gpt2-2x128",
        "--precision", "bf16", "--threads", "2", "--device", "cpu"]
    assert baseline["env"]["PYTHONPATH"].split(os.pathsep) == [str(tmp_path), "/elsewhere"]  # the tree timed first
    assert ppo_update.Worker("py", "floor", "gpt2-2x128", "fp32", 1).name == "floor-fp32"
    assert FakeWorkerProcess.started[1]["env"]["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/elsewhere"]
    monkeypatch.setattr(FakeWorkerProcess, "lines", "")  # it exits before saying it is ready
    with pytest.raises(RuntimeError, match=r"worker drlc-baseline-fp32 died \(exit 3\)"):
        ppo_update.Worker("py", "drlc", "gpt2-2x128", "fp32", 1, "cpu", tmp_path)


@pytest.mark.slow  # a real worker process: what it imports is decided by the PYTHONPATH it starts with
def test_a_baseline_worker_imports_the_baseline_trees_pipeline(tmp_path, capfd):
    """A copy of pipeline/ whose trainer refuses to import: the worker must load that copy, not this tree's."""
    shutil.copytree(ROOT / "pipeline", tmp_path / "pipeline")
    (tmp_path / "pipeline" / "train" / "trainer.py").write_text("raise ImportError('the baseline tree was imported')\n")
    with pytest.raises(RuntimeError, match="drlc-baseline-fp32 died"):
        ppo_update.Worker(sys.executable, "drlc", "gpt2-2x128", "fp32", 1, "cpu", tmp_path)
    assert "the baseline tree was imported" in capfd.readouterr().err


def test_an_unknown_precision_is_refused_before_any_worker_starts(monkeypatch, capsys):
    monkeypatch.setattr(ppo_update, "Worker", lambda *args, **kwargs: pytest.fail("a worker was started"))
    monkeypatch.setattr(sys, "argv", ["ppo_update.py", "--precisions", "fp16", "--trl-python", ""])
    with pytest.raises(SystemExit) as exited:
        ppo_update.main()
    assert exited.value.code == 2 and "--precisions fp16: use fp32, bf16 or fp32,bf16" in capsys.readouterr().err
