"""Each DVC stage's code deps equal the import closure of its stage script (pipeline/core/code_deps.py).

A module the script can import but the stage does not list leaves a stale output after an edit;
a listed module it cannot import re-runs the stage for nothing. Both fail here, naming the stage
and the paths, for dvc.yaml and for the DAG `drlc replay --dvc` writes.
"""
import ast
import os
import re
from pathlib import Path

import pytest
import yaml

from pipeline.commands.replay_dvc import STAGE_SCRIPT, dvc_stages
from pipeline.core.code_deps import CODE_ROOT, covers, import_closure
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


# params a stage declares without reading them through `params.`: the round list, which DVC itself
# expands (foreach) and which decides what the evaluate stage's curves cover.
READ_BY_DVC = {"rounds", "chunks", "switch"}
# the step modules a stage script passes the whole params to, where not pipeline/steps/<stage>.py
STEP_MODULES = {"switch_critic": ("switch", "chunk"), "switch_tagger": ("switch", "chunk")}


def params_read(path: Path) -> set[str]:
    """The params keys a stage script reads: `params.<section>.<key>`, or a section it passes on whole
    (`params.<section>`); `*` when it passes the whole `params` object on."""
    tree = ast.parse(path.read_text())
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    read = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Name) and node.id == "params"):
            continue
        parent = parents[node]
        if not isinstance(parent, ast.Attribute):
            if not (isinstance(parent, ast.Assign) and node in parent.targets):
                read.add("*")
            continue
        grand = parents[parent]
        if isinstance(grand, ast.Attribute):
            read.add(f"{parent.attr}.{grand.attr}")
        elif isinstance(grand, ast.Call) and grand.func is parent:
            read.update(READ_BY_DVC)  # params.round_keys()
        else:
            read.add(parent.attr)
    return read


def section_reads(path: Path) -> set[str]:
    """The params sections a module reads (`params.<section>`), for a stage that passes `params` on whole."""
    return set(re.findall(r"\bparams\.(\w+)", path.read_text())) - {"chunk_rounds", "round_keys", "switch_round"}


def dvc_params() -> dict[str, list[str]]:
    stages = yaml.safe_load((CODE_ROOT / "dvc.yaml").read_text())["stages"]
    return {name: stage.get("do", stage).get("params", []) for name, stage in stages.items()}


def params_problems(stage: str, read: set[str], declared: list[str]) -> list[str]:
    inside = lambda key, entry: key == entry or key.startswith(entry + ".")  # noqa: E731
    missing = sorted(k for k in read - READ_BY_DVC if not any(inside(k, d) for d in declared))
    unused = sorted(d for d in declared if d not in READ_BY_DVC and not any(inside(k, d) or inside(d, k) for k in read))
    wide = sorted(d for d in declared if "." not in d and d not in READ_BY_DVC and d not in read and d not in unused)
    return ([f"{stage}: declare params {missing}"] if missing else []) + \
           ([f"{stage}: params {unused} are never read"] if unused else []) + \
           ([f"{stage}: declare the keys it reads, not the whole sections {wide}"] if wide else [])


@pytest.mark.parametrize("stage", sorted(dvc_yaml_stages()))
def test_dvc_yaml_params_are_the_keys_the_stage_reads(stage):
    script, _ = dvc_yaml_stages()[stage]
    read = params_read(CODE_ROOT / script)
    if "*" in read:  # chunk, switch_*: the whole params go to their step modules, which read these sections
        modules = STEP_MODULES.get(stage, (stage,))
        read = read - {"*"} | set().union(*(section_reads(CODE_ROOT / "pipeline/steps" / f"{m}.py") for m in modules))
    if stage in ("ppo", "chunk", *STEP_MODULES):  # they pass `base` on for LoRA: steps/ppo_round.py reads base.lora_*
        used = set(re.findall(r"\bbase\.(\w+)", (CODE_ROOT / "pipeline/steps/ppo_round.py").read_text()))
        assert used == {"lora_r", "lora_alpha", "lora_target_modules"}
        read = read - {"base"} | {f"base.{key}" for key in used}
    assert params_problems(stage, read, dvc_params()[stage]) == []


def test_the_params_check_names_a_missing_and_an_unused_key():
    assert params_problems("rollout", {"run.seed", "rollout"}, ["run.seed", "run.device"]) == [
        "rollout: declare params ['rollout']", "rollout: params ['run.device'] are never read"]
    assert params_problems("prepare", {"run.seed", "world"}, ["run", "world"]) == [
        "prepare: declare the keys it reads, not the whole sections ['run']"]
