"""Helpers for end-to-end tests: a copy of the project in a temp dir with shrunken params."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PROJECT_FILES = ["pipeline", "stages", "prompts", "critics", "configs", "tasks", "dvc.yaml", "params.yaml", ".dvcignore"]


def tiny_params(n_rounds: int = 3, task: str = "sentiment", profile: str | None = None, **section_overrides) -> dict:
    """The demo params of `task` (params.yaml, or configs/demo-<task>.yaml; or configs/<profile>.yaml of
    that task) shrunk so the whole DAG runs in a few minutes on 2 CPU cores."""
    source = ROOT / ("params.yaml" if task == "sentiment" else f"configs/demo-{task}.yaml")
    source = ROOT / f"configs/{profile}.yaml" if profile else source
    raw = yaml.safe_load(source.read_text())
    raw["run"]["run_id"] = "e2e"
    raw["world"].update(n_reviews=4000, n_train_prompts=128, n_eval_prompts=8)
    raw["base"].update(steps=400, batch_size=32, vocab_size=512)
    raw["rollout"].update(batch_size=32, generation_batch_size=32)
    raw["ppo"].update(mini_batch_size=16)
    if task == "sentiment":
        raw["ppo"].update(learning_rate=0.0005)  # the task profiles keep their own (1e-4: see their headers)
    if task == "summarization":  # 32 rollouts a round left the reward rise within 2 standard errors
        raw["rollout"].update(batch_size=64, generation_batch_size=64)
    raw["evaluate"].update(n_prompts=8, samples_per_prompt=2, policy=f"round={n_rounds:04d}")
    raw["rounds"] = {f"{r:04d}": {"prev": "base" if r == 1 else f"round={r - 1:04d}"}
                     for r in range(1, n_rounds + 1)}
    for section, values in section_overrides.items():
        raw[section].update(values)
    return raw


class _ParamsDumper(yaml.SafeDumper):
    """Quotes every all-digit string: PyYAML (YAML 1.1) writes '0008' bare, and DVC (YAML 1.2) reads 0008 as 8."""


_ParamsDumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style='"' if text.isdigit() else None))


def dump_params(params: dict) -> str:
    """params as params.yaml text that PyYAML and DVC read alike (round keys stay strings)."""
    return yaml.dump(params, Dumper=_ParamsDumper, sort_keys=False)


SHARED_CACHE = "DRLC_TEST_DVC_CACHE"  # set by tests/conftest.py: a DVC cache folder for the whole test session


def make_project(tmp: Path, params: dict, *, shared_base: bool = True) -> Path:
    """Copy the project files into tmp/project, write params, and make it a git + DVC repo.

    shared_base: prepare and base come from the session's DVC run cache (`restore_base`), so each task
    and config pretrains its base model once per test session, not once per project.
    """
    project = tmp / "project"
    project.mkdir()
    for name in PROJECT_FILES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, project / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            shutil.copy(src, project / name)
    (project / "params.yaml").write_text(dump_params(params))
    run(["git", "init", "-q"], project)
    # the project's own git identity: `dvc exp run` commits, and a new user's (or CI's fresh) home has none
    run(["git", "config", "user.name", "drlc-test"], project)
    run(["git", "config", "user.email", "test@localhost"], project)
    run([sys.executable, "-m", "dvc", "init", "-q"], project)
    run([sys.executable, "-m", "dvc", "config", "core.analytics", "false"], project)
    if shared_base and params and os.environ.get(SHARED_CACHE):
        restore_base(project, Path(os.environ[SHARED_CACHE]))
    return project


def experiment_project(tmp: Path, params: dict, monkeypatch) -> Path:
    """make_project, committed to git (DVC experiments start from a commit), with the environment its queued
    experiments' stages need: this checkout's pipeline on PYTHONPATH, this venv's python first on PATH, no DVC
    analytics, no progress bars, one OpenMP thread, and no OpenAI key."""
    project = make_project(tmp, params)
    run(["git", "add", "-A"], project)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "demo"], project)
    for key, value in dict(PYTHONPATH=str(project), DVC_NO_ANALYTICS="1", TQDM_DISABLE="1", OMP_NUM_THREADS="1",
                           PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}").items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    return project


def restore_base(project: Path, shared: Path) -> None:
    """Run `dvc repro base` against a DVC cache shared by every project of the session, then move the
    outputs into the project's own cache.

    DVC's run cache keys a stage by its command, code, data and params, so an identical prepare and base
    are restored, not re-run (the first project of a config builds them). Only these two stages share:
    the project then goes back to its own cache, and its rounds run for real, so a test that compares two
    runs still compares two runs.
    """
    dvc(["config", "--local", "cache.dir", str(shared)], project)
    dvc(["repro", "base"], project)
    dvc(["config", "--local", "--unset", "cache.dir"], project)
    dvc(["commit", "--force", "prepare", "base"], project)


def run(cmd: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    # PATH starts with this interpreter's folder so that the stage commands' `python` is this one
    env = dict(os.environ, PYTHONPATH=str(cwd), DVC_NO_ANALYTICS="1", TQDM_DISABLE="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("OPENAI_API_KEY", None)
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"{cmd} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def dvc(args: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "dvc", *args], cwd, check)
