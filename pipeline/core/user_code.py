"""Importing the user's own Python files (a task file, a rule critic) by path, with errors that name their line."""
from __future__ import annotations

import hashlib
import importlib.util
import sys
import traceback
from pathlib import Path

from pipeline.core.errors import ConfigError


def import_file(path: str | Path, *, key: str):
    """The module of the file `path`, imported once per content (an edited file is imported afresh).

    Its folder goes on sys.path, so the file's own helper modules import as siblings. key: the setting that
    names the file, for the error. Raises ConfigError naming `key` and the file's line when the import fails.
    """
    path = Path(path)
    digest = hashlib.sha256(str(path.resolve()).encode() + path.read_bytes()).hexdigest()[:16]
    name = f"drlc_user_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        raise ConfigError(f"'{key}' = '{path}': importing it failed{where(error, path)}: "
                          f"{type(error).__name__}: {error}") from error
    sys.modules[name] = module
    return module


def file_sha(path: str | Path) -> str:
    """The first 12 hex digits of the SHA-256 of a file's bytes: its version in scorer names and cache keys."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]


def where(error: BaseException, path: Path) -> str:
    """' at <file> line N': the deepest frame of `error` in `path`'s folder ('' if none)."""
    folder = Path(path).resolve().parent
    if isinstance(error, SyntaxError) and error.lineno:
        return f" at {path} line {error.lineno}"
    frames = [f for f in traceback.extract_tb(error.__traceback__) if folder in Path(f.filename).resolve().parents]
    return f" at {frames[-1].filename} line {frames[-1].lineno}" if frames else ""
