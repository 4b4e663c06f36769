"""Whether a stage's output file still holds what dvc.lock recorded, and the commands that repair one that does not.

The project's outputs are hard links into DVC's cache (.dvc/config `cache.type hardlink,symlink`), so a file
truncated or edited in place corrupts the cache's copy too: `dvc checkout` restores the same bytes, and a
forced stage is linked back to the corrupt object. The repair that works: remove that cache object, then force
the stage that wrote the file (`dvc repro -f -s <stage>`); same params, seed and critic cache give the same file.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath


@dataclass(frozen=True)
class LockedOutput:
    project: Path  # the folder holding dvc.lock
    stage: str     # the stage that wrote the file, as `dvc repro -s` takes it
    md5: str       # the file's md5 in dvc.lock (through its folder's .dir listing when the output is a folder)


def file_md5(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def find_project(path: Path) -> Path | None:
    """The nearest folder at or above path that holds a dvc.lock."""
    for folder in [path.resolve(), *path.resolve().parents]:
        if (folder / "dvc.lock").is_file():
            return folder
    return None


def cache_object(project: Path, md5: str) -> Path:
    """Where DVC's cache (wherever `cache.dir` puts it) keeps the object of md5."""
    from dvc.repo import Repo

    with Repo(str(project)) as repo:
        return Path(repo.cache.local.oid_to_path(md5))


def locked_output(file: Path) -> LockedOutput | None:
    """The stage and md5 that dvc.lock records for file, or None (no dvc.lock above it, or no stage wrote it)."""
    import yaml

    project = find_project(file.parent)
    if project is None:
        return None
    relative = PurePosixPath(file.resolve().relative_to(project).as_posix())
    stages = (yaml.safe_load((project / "dvc.lock").read_text()) or {}).get("stages", {})
    for stage, entry in stages.items():
        for out in entry.get("outs", []):
            path, md5 = PurePosixPath(out["path"]), out.get("md5", "")
            if relative == path:
                return LockedOutput(project, stage, md5)
            if md5.endswith(".dir") and path in relative.parents:
                listing = cache_object(project, md5)
                if not listing.is_file():
                    return None
                inside = relative.relative_to(path).as_posix()
                found = [entry["md5"] for entry in json.loads(listing.read_text()) if entry["relpath"] == inside]
                return LockedOutput(project, stage, found[0]) if found else None
    return None


def repair_hint(file: Path) -> str:
    """What is wrong with file against dvc.lock and the commands that repair it, for an error's second half."""
    locked = locked_output(file)
    if locked is None:
        return "re-create it with the stage that writes it (`dvc repro` in a DVC project)"
    actual = file_md5(file)
    where = "" if locked.project == Path.cwd().resolve() else f" (from {locked.project})"
    force = f"`dvc repro -f -s {locked.stage}`"
    if actual == locked.md5:
        return f"it is the file stage {locked.stage} recorded in dvc.lock: re-create it with {force}{where}"
    obj = cache_object(locked.project, locked.md5)
    if obj.is_file() and file_md5(obj) == locked.md5:
        return (f"it is corrupt (md5 {actual}, dvc.lock records {locked.md5}) and DVC's cache holds the good copy: "
                f"restore it with `dvc checkout --force {_relative(file.parent, locked.project)}`{where}")
    removal = f"`rm -f {_relative(obj, locked.project)}`" if obj.is_relative_to(locked.project) else f"`rm -f {obj}`"
    return (f"it is corrupt (md5 {actual}, dvc.lock records {locked.md5}), and so is DVC's cache copy, a link to the "
            f"same file, so `dvc checkout` cannot restore it: run {removal}, then {force}{where}")


def _relative(path: Path, project: Path) -> str:
    return Path(path).resolve().relative_to(project).as_posix()
