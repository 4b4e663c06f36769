"""The dvc.yaml deps of a task file: the stages that run it depend on its code and template, and nothing else of tasks/.

DVC re-runs a stage when a dep changes, and dvc.yaml lists deps literally (templating cannot
splice a list into `deps`), so the files of `tasks/` a run reads are written into dvc.yaml by
`drlc task deps` (and by `drlc task new`), and `drlc check` and every stage that runs a task under
`dvc repro` (DVC_ROOT set; pipeline.tasks.check_params) bring them up to date and say so in one line
(a stage's own run then used the files as they are; DVC sees the new deps from the next run on):

- after each `- pipeline/tasks` dep (the stages that run a task): run.task's import closure in
  tasks/ (pipeline/core/code_deps.py), and the rule critic's (`critic.backend: rules`) when that
  is another file;
- after each `- prompts` dep (the stages that read the critic template): critic.template when
  it lies in tasks/.

A built-in task (sentiment, toxicity, summarization) gets no line: its stages depend on no file of
tasks/, so editing a task file never re-runs them.
"""
from __future__ import annotations

import re
from pathlib import Path

from pipeline.core.code_deps import task_closure
from pipeline.core.config import is_task_file
from pipeline.core.errors import ConfigError

MARK = "# run.task's code (drlc task deps)"
_TASK_LINE = re.compile(r"^\s*- tasks(/\S*)?(\s+#.*)?$")  # a dep on tasks/ or a file in it
_ANCHORS = {"code": re.compile(r"^(\s*)- pipeline/tasks\s*$"), "templates": re.compile(r"^(\s*)- prompts\s*$")}


def task_deps(params, root: str | Path = ".") -> dict[str, list[str]]:
    """{"code": files of tasks/ the task stages run, "templates": the critic template when in tasks/}."""
    root = Path(root)
    code: set[str] = set()
    if is_task_file(params.run.task):
        path = _task_file(params, root)
        if not path.is_file():
            raise ConfigError(f"'run.task' = {params.run.task!r}: no file {path}; write one with `drlc task new NAME`.")
        code.update(task_closure(path.relative_to(root), root=root))
    critic = params.critic
    if critic.enabled and critic.backend == "rules" and critic.model_dir and (root / critic.model_dir).is_file():
        code.update(p for p in task_closure(critic.model_dir, root=root) if p.startswith("tasks/"))
    templates = [critic.template] if critic.template.startswith("tasks/") else []
    return {"code": sorted(code), "templates": templates}


def with_task_deps(text: str, deps: dict[str, list[str]]) -> str:
    """dvc.yaml's `text` with every tasks/ dep line replaced by `deps`, placed after the anchors."""
    out = []
    for line in text.splitlines(keepends=True):
        if _TASK_LINE.match(line.rstrip("\n")):
            continue
        out.append(line)
        for kind, anchor in _ANCHORS.items():
            match = anchor.match(line.rstrip("\n"))
            if match:
                out += [f"{match.group(1)}- {path}  {MARK}\n" for path in deps[kind]]
    return "".join(out)


def write_task_deps(params, root: str | Path = ".") -> dict[str, list[str]]:
    """Rewrite root/dvc.yaml's tasks/ deps for `params`; returns the deps written."""
    deps = task_deps(params, root)
    path = Path(root) / "dvc.yaml"
    path.write_text(with_task_deps(path.read_text(encoding="utf-8"), deps), encoding="utf-8")
    return deps


def sync_task_deps(params, root: str | Path = ".") -> str | None:
    """Bring root/dvc.yaml's tasks/ deps up to date for `params`; returns the one line saying what changed, or None
    when nothing did (no dvc.yaml, a replay folder running the checkout's task file, or deps already right)."""
    path = Path(root) / "dvc.yaml"
    if not path.is_file() or (is_task_file(params.run.task) and not _task_file(params, root).is_file()):
        return None
    text = path.read_text(encoding="utf-8")
    deps = task_deps(params, root)
    if with_task_deps(text, deps) == text:
        return None
    listed = sorted({line.split("- ", 1)[1].split()[0] for line in text.splitlines() if _TASK_LINE.match(line)})
    path.write_text(with_task_deps(text, deps), encoding="utf-8")
    return (f"dvc.yaml: the stages that run {params.run.task!r} now depend on {deps['code'] + deps['templates']} "
            f"(were {listed}); a later edit of these files re-runs them (drlc task deps does this by hand).")


def _task_file(params, root: str | Path) -> Path:
    return task_path(params.run.task, root)


def task_path(spec: str, root: str | Path = ".") -> Path:
    """The file of a file or module `run.task`, relative to `root` (the DVC project)."""
    relative = Path(spec) if spec.endswith(".py") or "/" in spec else Path(*spec.split(".")).with_suffix(".py")
    return Path(root) / relative
