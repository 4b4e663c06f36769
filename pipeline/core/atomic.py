"""Atomic writes: a file or a folder is either absent, the old one, or complete.

`atomic_file(target)` hands out a temporary path in the target's folder; when the block ends
without an error it is renamed over `target` (`os.replace`, atomic on one filesystem), else it
is removed. `write_text` and every table, metrics, params and checkpoint file of drlc go through it.

`atomic_folder(target)` hands out a fresh temporary folder next to `target`
(`.<name>.tmp-<pid>-<hex>`, on the same filesystem, so renames are atomic). Write every file
of the checkpoint there; when the block ends without an error the temporary folder is renamed
to `target`. An existing target is first renamed aside (`.<name>.old-<pid>-<hex>`) and removed
only after the new one is in place, so a crash between the two renames leaves `target` absent
(never half-written) and the old checkpoint still on disk under its aside name.
A killed writer leaves only dot-named temporary folders, which no stage reads as a checkpoint
(stages are given `target` itself); the next write of the same target removes them.
"""
from __future__ import annotations

import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path

TEMP_MARK, ASIDE_MARK = ".tmp-", ".old-"


def _sibling(target: Path, mark: str) -> Path:
    return target.parent / f".{target.name}{mark}{os.getpid()}-{uuid.uuid4().hex[:8]}"


def stale_folders(target: str | Path) -> list[Path]:
    """Temporary and aside folders a killed writer of `target` left next to it."""
    target = Path(target)
    if not target.parent.is_dir():
        return []
    prefixes = (f".{target.name}{TEMP_MARK}", f".{target.name}{ASIDE_MARK}")
    return sorted(p for p in target.parent.iterdir() if p.name.startswith(prefixes))


@contextmanager
def atomic_file(target: str | Path):
    """Yield the temporary path `.<name>.tmp` beside `target`; on success it replaces `target`, on an error
    it is removed.

    The name is fixed, not random: torch.save records its file's name inside the archive, so a random
    name would make every checkpoint's bytes differ. One process writes each output, so no two writers
    share a temporary name; a killed writer's leftover is overwritten by the next write.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(f".{target.name}.tmp")
    try:
        yield temp
        os.replace(temp, target)
    finally:
        if temp.exists():
            temp.unlink()


def write_text(target: str | Path, text: str) -> Path:
    """Write `text` (UTF-8) to `target` atomically; return the path."""
    with atomic_file(target) as temp:
        temp.write_text(text, encoding="utf-8")
    return Path(target)


@contextmanager
def atomic_folder(target: str | Path):
    """Yield a temporary folder; on success it replaces `target` (see the module docstring).

    On an error inside the block the temporary folder is removed and `target` is untouched.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    for stale in stale_folders(target):
        shutil.rmtree(stale, ignore_errors=True)
    temp = _sibling(target, TEMP_MARK)
    temp.mkdir()
    try:
        yield temp
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    aside = None
    if target.exists():
        aside = _sibling(target, ASIDE_MARK)
        os.rename(target, aside)
    os.rename(temp, target)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
