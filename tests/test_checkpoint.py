"""Atomic checkpoints: a writer killed with SIGKILL mid-write leaves the target absent or old, never half-written.

The writer runs save_policy; a hook stops it after the LM weights and tokenizer are written and
before the value head is. Each kill test runs twice: `killed_process`, a real subprocess the test
kills with SIGKILL there (slow), and `frozen_thread`, a thread of this process held there until the
test ends: as after the kill, none of the writer's code (no `except`, no `finally`) runs while the
test looks at the disk.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from pipeline.core.atomic import atomic_file, atomic_folder, stale_folders
from pipeline.model.policy import VALUE_HEAD_FILE, load_policy, save_policy
from tests.test_resume import save_tiny_base

ROOT = Path(__file__).resolve().parents[1]
WRITER = """
import sys, time
from pathlib import Path
import torch
import pipeline.model.policy as policy_module
from pipeline.model.policy import load_policy, save_policy
base, target, marker = sys.argv[1:]
policy, tokenizer = load_policy(base, seed=0)
with torch.no_grad():
    policy.v_head.bias.fill_(7.0)  # the new checkpoint differs from the old one
real_save_file = policy_module.save_file
def blocking_save_file(tensors, path):  # the value head is the last file written
    Path(marker + ".tmp").write_text(str(path))
    Path(marker + ".tmp").rename(marker)  # the parent must never read a half-written marker
    time.sleep(600)
policy_module.save_file = blocking_save_file
save_policy(policy, tokenizer, target)
"""


def kill_mid_write(base: Path, target: Path, tmp: Path) -> Path:
    """Run the blocking writer, SIGKILL it once it is inside the write; return where it was writing."""
    marker = tmp / "writing"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(base), str(target), str(marker)], env=env)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert writer.poll() is None, "the writer exited before reaching the blocking hook"
        assert time.monotonic() < deadline, "the writer never reached the blocking hook"
        time.sleep(0.05)
    os.kill(writer.pid, signal.SIGKILL)
    assert writer.wait(timeout=30) == -signal.SIGKILL
    return Path(marker.read_text())


class _Released(BaseException):
    """Ends a frozen writer at teardown, once the test has looked at what it left."""


@pytest.fixture(params=["frozen_thread", pytest.param("killed_process", marks=pytest.mark.slow)])
def stop_mid_write(request, monkeypatch):
    """kill_mid_write, or the same writer as a thread of this process frozen where the process is killed."""
    if request.param == "killed_process":
        yield kill_mid_write
        return
    import pipeline.model.policy as policy_module

    real_save_file, release, writers, writing = policy_module.save_file, threading.Event(), [], []

    def save_file(tensors, path):  # the value head is the last file written; only the writers stop there
        if threading.current_thread() not in writers:
            return real_save_file(tensors, path)
        writing.append(Path(path))
        release.wait()
        raise _Released

    def write(base: Path, target: Path) -> None:
        policy, tokenizer = load_policy(base, seed=0)
        with torch.no_grad():
            policy.v_head.bias.fill_(7.0)  # the new checkpoint differs from the old one
        try:
            save_policy(policy, tokenizer, target)
        except _Released:
            pass

    def freeze_mid_write(base: Path, target: Path, tmp: Path) -> Path:
        writer = threading.Thread(target=write, args=(base, target), daemon=True)
        writers.append(writer)
        writer.start()
        deadline = time.monotonic() + 120
        while not writing:
            assert writer.is_alive(), "the writer ended before reaching the blocking hook"
            assert time.monotonic() < deadline, "the writer never reached the blocking hook"
            time.sleep(0.01)
        return writing[0]

    monkeypatch.setattr(policy_module, "save_file", save_file)
    yield freeze_mid_write
    release.set()
    for writer in writers:
        writer.join(timeout=60)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ckpt") / "base"
    save_tiny_base(path)
    return path


def test_a_first_write_killed_midway_leaves_no_checkpoint(base, tmp_path, stop_mid_write):
    target = tmp_path / "policy"
    writing = stop_mid_write(base, target, tmp_path)
    assert writing.parent != target and writing.parent.parent == tmp_path  # it wrote next to the target
    assert (writing.parent / "config.json").is_file()  # the kill came mid-write: weights there, head not
    assert not target.exists()
    assert stale_folders(target) == [writing.parent] and writing.parent.name.startswith(".")
    policy, tokenizer = load_policy(base, seed=0)
    save_policy(policy, tokenizer, target)  # the next write succeeds and clears what the killed one left
    assert stale_folders(target) == [] and (target / VALUE_HEAD_FILE).is_file()


def test_a_replacing_write_killed_midway_keeps_the_old_checkpoint(base, tmp_path, stop_mid_write):
    target = tmp_path / "policy"
    policy, tokenizer = load_policy(base, seed=0)
    save_policy(policy, tokenizer, target)
    old_bias = load_policy(target)[0].v_head.bias.clone()
    stop_mid_write(base, target, tmp_path)
    reloaded = load_policy(target)[0]
    assert torch.equal(reloaded.v_head.bias, old_bias) and not torch.equal(old_bias, torch.full_like(old_bias, 7.0))
    assert (target / VALUE_HEAD_FILE).is_file()  # the old checkpoint is whole


def test_a_finished_write_replaces_the_old_folder_and_an_error_leaves_it(base, tmp_path):
    target = tmp_path / "ckpt"
    target.mkdir()
    (target / "leftover.txt").write_text("old")
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic_folder(target) as folder:
            (folder / "new.txt").write_text("new")
            raise RuntimeError("disk full")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"] and (target / "leftover.txt").is_file()
    with atomic_folder(target) as folder:
        (folder / "new.txt").write_text("new")
    assert sorted(p.name for p in target.iterdir()) == ["new.txt"]  # replaced, not merged into
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_a_torch_file_written_atomically_has_the_same_bytes_every_time(tmp_path):
    """torch.save names its archive after the file it writes: a random temporary name changed every
    optimizer.pt, so a re-run's checkpoint never hashed the same in DVC."""
    state = {"step": torch.tensor(3.0), "exp_avg": torch.arange(4.0)}
    for folder in ("a", "b"):
        with atomic_file(tmp_path / folder / "optimizer.pt") as temp:
            torch.save(state, temp)
    assert (tmp_path / "a" / "optimizer.pt").read_bytes() == (tmp_path / "b" / "optimizer.pt").read_bytes()
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["optimizer.pt"]
