"""The DVC form of a critic audit: `drlc critic eval --dvc DIR` writes DIR/dvc.yaml.

The file holds one stage, ``critic_eval``, whose command is the same `drlc critic eval`
(without ``--dvc``) run from the project root (``wdir``), so params, the critic cache and
every path resolve exactly as for the command typed. It depends on the labelled files, the
template, the critic code and the params file's ``critic`` section, and declares the
audit's table and report as outputs and its summary as metrics. The project's own
``dvc.yaml`` is untouched: `dvc repro` still runs only the training DAG, and
`dvc repro DIR/dvc.yaml` runs (or, with nothing changed, skips) the audit. Other stages
already in DIR/dvc.yaml are kept.
"""
from __future__ import annotations

import os
import shlex
from pathlib import Path

import yaml

from pipeline.core import store
from pipeline.core.code_deps import CODE_ROOT, import_closure
from pipeline.core.errors import ConfigError

__all__ = ["CODE_DEPS", "write_audit_stage"]

AUDIT_MODULE = "pipeline/audit/critic_eval.py"  # what `drlc critic eval` runs
CODE_DEPS = [AUDIT_MODULE] + import_closure(AUDIT_MODULE)  # as a stage's deps: the code it can import


def _relative(path: Path, root: Path) -> str:
    return os.path.relpath(path.resolve(), root.resolve())


def write_audit_stage(dvc_dir: str | Path, *, args: list[str], params: str, template: str, inputs: list[str],
                      data_dir: str, out_dir: str, audit: str) -> Path:
    """Write (or update) the ``critic_eval`` stage of DVC_DIR/dvc.yaml; return the file's path.

    :param dvc_dir: folder for the dvc.yaml, inside the project root (the current folder)
    :param args: the `drlc critic eval` arguments the stage runs (no ``--dvc``), paths as typed
    :param params: the params file; template: critic.template; inputs: the labelled span files
    :param data_dir, out_dir, audit: where the audit writes (see ``write_audit``)
    :raises ConfigError: the current folder is not a DVC project root, or DVC_DIR is outside it
    """
    root = Path.cwd()
    if not (root / ".dvc").is_dir():
        raise ConfigError(f"'{root}' is not the root of a DVC project (no .dvc folder): run `drlc critic eval "
                          "--dvc` from your project's root, or run `dvc init` there first.")
    dvc_dir = Path(dvc_dir)
    if _relative(dvc_dir, root).startswith(".."):
        raise ConfigError(f"--dvc {str(dvc_dir)!r} is outside the project root '{root}'; pass a folder inside it")
    code = [_relative(CODE_ROOT / dep, root) for dep in CODE_DEPS]
    code = [dep for dep in code if not dep.startswith("..")]  # an installed drlc is not part of the project
    stage = {
        "wdir": _relative(root, dvc_dir.resolve()) if dvc_dir.resolve() != root.resolve() else ".",
        "cmd": shlex.join(["python", "-m", "pipeline", "critic", "eval", *args]),
        "deps": list(dict.fromkeys([*inputs, template, *code])),
        "params": [{params: ["critic"]}],
        "outs": [store.audit_dir(data_dir, audit).as_posix(), (Path(out_dir) / "report.md").as_posix()],
        "metrics": [{(Path(out_dir) / "summary.json").as_posix(): {"cache": False}}],
    }
    dvc_dir.mkdir(parents=True, exist_ok=True)
    path = dvc_dir / "dvc.yaml"
    existing = yaml.safe_load(path.read_text()) if path.is_file() else None
    document = existing if isinstance(existing, dict) else {}
    document.setdefault("stages", {})["critic_eval"] = stage
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path
