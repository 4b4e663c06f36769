"""The code a stage script runs: its import closure inside `pipeline/`, read statically with `ast`.

DVC re-runs a stage when one of its `deps` changes, so the deps of a stage must name every
`pipeline/` module its script can import, and nothing it cannot. This module computes that
set; tests/test_dvc_deps.py checks dvc.yaml against it and pipeline/commands/replay_dvc.py writes the
replay DAG's deps from it.

Rules, all static (nothing is imported):
- every `import` and `from ... import` statement counts, also one inside a function: a lazy
  import runs when its function does, and a static reader cannot tell which functions a
  stage calls, so the closure may over-approximate (a dep too many re-runs a stage whose
  outputs then hash the same; a dep too few leaves a stale output);
- importing `pipeline.a.b` runs `pipeline/__init__.py` and `pipeline/a/__init__.py` too; a
  module holding nothing but a docstring runs no code and is left out;
- a package that imports its own modules by name at run time (`DYNAMIC_PACKAGES`, e.g.
  `pipeline.tasks.get_task(run.task)`) brings in every module under it.

A user's task file (`run.task: tasks/x.py`) is read the same way by `task_closure`: the file and
the modules of the project's `tasks/` folder it imports as siblings (drlc puts that folder on
`sys.path`), transitively; the stages that run it depend on those files and on no other file of
`tasks/` (pipeline/tasks/_deps.py writes them into dvc.yaml), and `closure_sha` of the same
list is the reward's version and the rule critic's cache identity.
"""
from __future__ import annotations

import ast
import hashlib
from pathlib import Path

CODE_ROOT = Path(__file__).resolve().parents[2]  # the checkout: holds pipeline/ and stages/
DYNAMIC_PACKAGES = ("pipeline.tasks",)  # get_task imports pipeline.tasks.<run.task> with importlib

# The layers of pipeline/, lowest first, in the order a round uses them. A module imports only
# modules of its own layer or of a lower one (tests/test_layers.py); README's Layout names each.
LAYERS = ("core", "parallel", "model", "train", "data", "evaluate", "rewards", "critic", "tasks", "steps",
          "audit", "studies", "commands")


def import_closure(script: str | Path, *, root: Path = CODE_ROOT) -> list[str]:
    """The `pipeline/` modules `script` can import, directly or transitively, as sorted root-relative paths.

    >>> "pipeline/steps/rollout.py" in import_closure("stages/rollout.py")
    True
    """
    seen: set[str] = set()
    todo = [_module_names(root / script, root)]
    while todo:
        for name in todo.pop():
            if name in seen:
                continue
            seen.add(name)
            path = _module_file(name, root)
            todo.append(_module_names(path, root) | _dynamic_modules(name, root))
    files = (_module_file(name, root) for name in seen)
    return sorted(path.relative_to(root).as_posix() for path in files if _runs_code(path))


def task_closure(path: str | Path, *, root: str | Path = ".") -> list[str]:
    """`path` (a file of root/tasks/) and the files of tasks/ it imports, transitively, as sorted root-relative paths.

    An import counts when its name (or a leading part: `helpers.words`) is a module of tasks/ (a
    file, or a package's __init__.py and the submodule), as `import x`, `from x import y` or
    `from tasks.x import y`; any other import (the standard library, installed packages) is not
    the project's code.
    """
    root = Path(root).resolve()
    folder = root / "tasks"
    seen: set[Path] = set()
    todo = [(root / path).resolve()]
    while todo:
        file = todo.pop()
        if file in seen:
            continue
        seen.add(file)
        todo += _task_imports(file, folder)
    return sorted((p.relative_to(root) if root in p.parents else p).as_posix() for p in seen)


def code_sha(path: str | Path, *, root: str | Path = ".") -> str:
    """closure_sha of task_closure(path): the version of a task file or rule critic with its tasks/ helpers."""
    return closure_sha(task_closure(path, root=root), root=root)


def closure_sha(paths: list[str], *, root: str | Path = ".") -> str:
    """The first 12 hex digits of the SHA-256 over each path and its bytes: one edit of any file changes it."""
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(path.encode() + b"\0" + (Path(root) / path).read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def _task_imports(file: Path, folder: Path) -> list[Path]:
    """The files of `folder` (tasks/) that `file` imports, by any dotted name or `from` form."""
    names = []
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"), filename=str(file))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    files = []
    for name in names:
        parts = name.split(".")
        parts = parts[1:] if parts[0] == folder.name else parts
        for end in range(1, len(parts) + 1):
            base = folder.joinpath(*parts[:end])
            files += [p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()]
    return files


def import_graph(*, root: Path = CODE_ROOT) -> dict[str, set[str]]:
    """Every `pipeline.*` module -> the `pipeline.*` modules it imports (lazy imports too; parent packages not added)."""
    graph = {}
    for path in sorted((root / "pipeline").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        graph[name] = {m for m in _module_names(path, root, parents=False) if m != name}
    return graph


def layer_of(module: str) -> str | None:
    """The layer (a folder of LAYERS) of a `pipeline.*` module; None for pipeline/__init__ and __main__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def covers(dep: str, module: str) -> bool:
    """True when the DVC dep `dep` (a file, or a folder covering everything under it) includes `module`."""
    dep = dep.rstrip("/")
    return module == dep or module.startswith(dep + "/")


def _module_names(path: Path, root: Path, *, parents: bool = True) -> set[str]:
    """The `pipeline.*` modules (and, with `parents`, their parent packages) that the file at `path` imports."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            candidates = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in candidates:
            if name.split(".")[0] == "pipeline" and _module_file(name, root, missing_ok=True):
                parts = name.split(".")
                first = 0 if parents else len(parts) - 1
                names.update(".".join(parts[: i + 1]) for i in range(first, len(parts)))
    return names


def _dynamic_modules(name: str, root: Path) -> set[str]:
    """Every module under `name` when it is one of DYNAMIC_PACKAGES, else nothing."""
    if name not in DYNAMIC_PACKAGES:
        return set()
    folder = root.joinpath(*name.split("."))
    return {".".join(p.relative_to(root).with_suffix("").parts) for p in folder.rglob("*.py") if p.name != "__init__.py"}


def _module_file(name: str, root: Path, *, missing_ok: bool = False) -> Path | None:
    """pipeline/a/b.py or pipeline/a/b/__init__.py for `pipeline.a.b`; None (missing_ok) for a name that is no module."""
    base = root.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    if missing_ok:
        return None
    raise FileNotFoundError(f"module {name!r} has no file under {root}")


def _runs_code(path: Path) -> bool:
    """False for a module whose only statement is its docstring."""
    body = ast.parse(path.read_text(), filename=str(path)).body
    return not all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body)
