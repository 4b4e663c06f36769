"""The DVC cache link type of .dvc/config, checked with the real dvc on a ppo-like scratch project.

The scratch DAG mimics the pipeline's checkpoints: a base stage, then rounds whose stage reads
models/<prev> and writes models/round=N (weights + optimizer state) with pipeline.core.atomic's
atomic_folder, plus a `cache: false` metrics file and an undeclared side file. With the project's
link type, `dvc repro` (also after a parameter change that replaces every linked output) and
`dvc exp run` work and never corrupt the cache; the DVC facts docs/disk.md builds on hold: a
deleted file of a cached output or a deleted `cache: false` output makes its stage changed and
re-runs it and every later round, and a stage restored from the run-cache does not restore an
undeclared side file. The last test runs the demo DAG itself (2 tiny rounds) with the link type.
"""
from __future__ import annotations

import configparser
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from e2e import ROOT, dvc, make_project, run, tiny_params

pytestmark = pytest.mark.slow

STAGE = '''import sys, pathlib
from pipeline.core.atomic import atomic_folder
import yaml
prev, out, key = sys.argv[1:4]
lr = yaml.safe_load(open("params.yaml"))["lr"]
weights = pathlib.Path(prev, "weights.bin").read_bytes()
with atomic_folder(out) as folder:
    (folder / "weights.bin").write_bytes(weights + f"{key}:{lr};".encode())
    (folder / "optimizer.pt").write_bytes(f"moments {key} {lr}".encode() * 64)
    (folder / "tokenizer.json").write_text("the same tokenizer in every checkpoint")
pathlib.Path("metrics").mkdir(exist_ok=True)
pathlib.Path("metrics", f"round={key}.json").write_text(f'{{"lr": {lr}}}')
pathlib.Path("side").mkdir(exist_ok=True)
pathlib.Path("side", f"round={key}.txt").write_text("state only this stage wrote")
'''


def configured_cache_type() -> str:
    config = configparser.ConfigParser()
    config.read(ROOT / ".dvc" / "config")
    return config.get("cache", "type", fallback="reflink,copy")


def make_scratch(tmp_path: Path) -> Path:
    project = tmp_path / "scratch"
    (project / "pipeline" / "core").mkdir(parents=True)
    (project / "pipeline" / "__init__.py").write_text("")
    (project / "pipeline" / "core" / "__init__.py").write_text("")
    shutil.copy(ROOT / "pipeline" / "core" / "atomic.py", project / "pipeline" / "core" / "atomic.py")
    (project / "step.py").write_text(STAGE)
    (project / "params.yaml").write_text("lr: 1\nrounds:\n" + "".join(
        f"  '{r:04d}': {{prev: {'base' if r == 1 else f'round={r - 1:04d}'}}}\n" for r in (1, 2, 3)))
    stages = {
        "base": {"cmd": "python -c \"import pathlib; p = pathlib.Path('models/base'); p.mkdir(parents=True); "
                        "(p / 'weights.bin').write_bytes(b'base;' * 100)\"", "outs": ["models/base"]},
        "ppo": {"foreach": "${rounds}", "do": {
            "cmd": "python step.py models/${item.prev} models/round=${key} ${key}",
            "deps": ["step.py", "pipeline/core/atomic.py", "models/${item.prev}"], "params": ["lr"],
            "outs": ["models/round=${key}"], "metrics": [{"metrics/round=${key}.json": {"cache": False}}]}},
    }
    (project / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}, sort_keys=False))
    (project / ".gitignore").write_text("side/\n")
    run(["git", "init", "-q"], project)
    dvc(["init", "-q"], project)
    dvc(["config", "core.analytics", "false"], project)
    dvc(["config", "cache.type", configured_cache_type()], project)
    return project


def commit(project: Path, message: str) -> None:
    run(["git", "add", "-A"], project)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", message], project)


def cache_files(project: Path) -> list[Path]:
    return [p for p in (project / ".dvc" / "cache" / "files" / "md5").rglob("*")
            if p.is_file() and not p.name.endswith(".dir")]


def assert_cache_intact(project: Path) -> None:
    """Every file in the cache still has the content its name (md5) says: no stage wrote into one."""
    files = cache_files(project)
    assert files
    for path in files:
        assert hashlib.md5(path.read_bytes()).hexdigest() == path.parent.name + path.name, path


def changed_stages(project: Path) -> set[str]:
    return set(json.loads(dvc(["status", "--json"], project).stdout))


def test_repro_and_exp_run_with_the_configured_link_type(tmp_path):
    cache_type = configured_cache_type()
    assert "copy" not in cache_type and "reflink" not in cache_type  # the setting under test: no second copy
    project = make_scratch(tmp_path)
    dvc(["repro"], project)
    weights = project / "models" / "round=0003" / "weights.bin"
    linked = weights.is_symlink() or weights.stat().st_nlink > 1
    assert linked and not weights.resolve().stat().st_mode & 0o222, "outputs are read-only links into the cache"
    assert weights.read_bytes().endswith(b"0001:1;0002:1;0003:1;")
    tokenizers = [project / "models" / f"round={r:04d}" / "tokenizer.json" for r in (1, 3)]
    assert os.path.samefile(*tokenizers)  # identical files in two checkpoints: one file on disk
    commit(project, "three rounds")

    (project / "params.yaml").write_text((project / "params.yaml").read_text().replace("lr: 1", "lr: 2"))
    dvc(["repro"], project)  # every round re-runs and replaces its linked output folder
    assert weights.read_bytes().endswith(b"0001:2;0002:2;0003:2;") and changed_stages(project) == set()
    assert_cache_intact(project)  # the lr: 1 versions are still in the cache, unmodified
    commit(project, "lr 2")

    dvc(["exp", "run", "-S", "lr=3"], project)
    assert weights.read_bytes().endswith(b"0003:3;") and changed_stages(project) == set()
    experiments = json.loads(dvc(["exp", "show", "--json"], project).stdout)
    assert any(e.get("experiments") for e in experiments), experiments
    assert_cache_intact(project)

    # docs/disk.md's clean-up of finished experiments: keep only what the workspace uses
    before = cache_files(project)
    dvc(["gc", "--workspace", "--force"], project)
    assert len(cache_files(project)) < len(before) and changed_stages(project) == set()
    assert weights.read_bytes().endswith(b"0003:3;")
    assert_cache_intact(project)


def test_dvc_facts_behind_the_retention_design(tmp_path):
    project = make_scratch(tmp_path)
    dvc(["repro"], project)
    commit(project, "three rounds")

    # a file deleted from a cached output: that stage is changed, and repro re-runs it and the rounds after it
    (project / "models" / "round=0002" / "optimizer.pt").unlink()
    assert "ppo@0002" in changed_stages(project)
    rerun = dvc(["repro"], project).stdout
    assert "ppo@0002" in rerun and "ppo@0003" in rerun and changed_stages(project) == set()

    # a deleted `cache: false` output: also changed
    (project / "metrics" / "round=0001.json").unlink()
    assert "ppo@0001" in changed_stages(project)
    dvc(["repro"], project)

    # the run-cache restores declared outputs only: an undeclared side file stays missing
    shutil.rmtree(project / "models" / "round=0003")
    (project / "side" / "round=0003.txt").unlink()
    restored = dvc(["repro", "ppo@0003"], project).stdout
    assert "skipping run, checking out outputs" in restored and (project / "models" / "round=0003" / "optimizer.pt").is_file()
    assert not (project / "side" / "round=0003.txt").exists()


@pytest.mark.long  # the demo DAG on top of the scratch-DAG link tests
def test_demo_pipeline_repro_and_exp_run_with_the_configured_link_type(tmp_path):
    project = make_project(tmp_path, tiny_params(n_rounds=2, world={"n_reviews": 2000}, base={"steps": 200}))
    dvc(["config", "cache.type", configured_cache_type()], project)
    dvc(["repro", "-q"], project)
    weights = project / "models" / "round=0002" / "model.safetensors"
    assert weights.is_symlink() or weights.stat().st_nlink > 1
    commit(project, "demo")
    dvc(["exp", "run", "-q", "-S", "ppo.learning_rate=0.0002"], project)  # re-runs both ppo rounds and evaluate
    assert changed_stages(project) == set() and json.loads((project / "metrics" / "eval.json").read_text())
    assert_cache_intact(project)
