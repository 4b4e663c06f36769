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
"""
from __future__ import annotations

import ast
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
