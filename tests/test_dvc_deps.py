"""Each DVC stage's code deps equal the import closure of its stage script (pipeline/commands/code_deps.py).

A module the script can import but the stage does not list leaves a stale output after an edit;
a listed module it cannot import re-runs the stage for nothing. Both fail here, naming the stage
and the paths, for dvc.yaml and for the DAG `drlc replay --dvc` writes.
"""
import os
import re
from pathlib import Path

import pytest
import yaml

from pipeline.commands.code_deps import CODE_ROOT, covers, import_closure
from pipeline.commands.replay_dvc import STAGE_SCRIPT, dvc_stages
from pipeline.core.config import load_params


def code_dep_problems(stage: str, script: str, deps: list[str]) -> list[str]:
    """What is wrong with a stage's code deps (paths relative to the checkout); [] when they match."""
    code = [d for d in deps if d.startswith(("pipeline/", "stages/"))]
    imported = [script] + import_closure(script)
    missing = [m for m in imported if not any(covers(d, m) for d in code)]
    unused = [d for d in code if not any(covers(d, m) for m in imported)]
    return ([f"{stage}: add to deps {missing} (imported by {script})"] if missing else []) + \
           ([f"{stage}: remove from deps {unused} ({script} never imports them)"] if unused else [])


def dvc_yaml_stages() -> dict[str, tuple[str, list[str]]]:
    stages = yaml.safe_load((CODE_ROOT / "dvc.yaml").read_text())["stages"]
    found = {}
    for name, stage in stages.items():
        body = stage.get("do", stage)
        script = re.match(r"python (stages/\w+\.py)", body["cmd"]).group(1)
        found[name] = (script, body["deps"])
    return found


@pytest.mark.parametrize("stage", sorted(dvc_yaml_stages()))
def test_dvc_yaml_code_deps_are_the_import_closure(stage):
    script, deps = dvc_yaml_stages()[stage]
    assert code_dep_problems(stage, script, deps) == []


def test_replay_dag_code_deps_are_the_import_closure(tmp_path):
    run_dir, out_dir = tmp_path / "run", tmp_path / "out"
    run_dir.mkdir(), out_dir.mkdir()
    stages = dvc_stages(run_dir, out_dir, load_params(CODE_ROOT / "params.yaml"), allow_new_calls=False)["stages"]
    assert set(stages) == {"replay", "evaluate"}
    for name, stage in stages.items():
        in_checkout = [Path(os.path.normpath(out_dir / d)) for d in stage["deps"]]
        deps = [p.relative_to(CODE_ROOT).as_posix() for p in in_checkout if p.is_relative_to(CODE_ROOT)]
        assert code_dep_problems(name, STAGE_SCRIPT, deps) == []


def test_the_check_names_a_missing_and_an_unused_module():
    script, deps = dvc_yaml_stages()["ppo"]
    broken = [d for d in deps if d != "pipeline/model/reference.py"] + ["pipeline/model/sft.py"]
    assert code_dep_problems("ppo", script, broken) == [
        "ppo: add to deps ['pipeline/model/reference.py'] (imported by stages/ppo.py)",
        "ppo: remove from deps ['pipeline/model/sft.py'] (stages/ppo.py never imports them)"]


def test_closure_follows_lazy_and_dynamic_imports_and_skips_docstring_only_packages(tmp_path):
    pkg = tmp_path / "pipeline"
    (pkg / "tasks").mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""only a docstring"""\n')
    (pkg / "tasks" / "__init__.py").write_text("import importlib\n")
    (pkg / "tasks" / "one.py").write_text("def f():\n    from pipeline import lazy\n")
    (pkg / "lazy.py").write_text("X = 1\n")
    (pkg / "unused.py").write_text("Y = 2\n")
    (tmp_path / "stage.py").write_text("from pipeline.tasks import get_task\n")
    assert import_closure("stage.py", root=tmp_path) == [
        "pipeline/lazy.py", "pipeline/tasks/__init__.py", "pipeline/tasks/one.py"]
