"""The base model of a task's world seed, pretrained once and kept in a scratch folder (never committed)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import tempfile
from pathlib import Path

from pipeline.core.config import BaseParams
from pipeline.steps.base import build_base_model

BUILD_INFO = "study_base.json"  # pretraining time and loss, kept next to the cached model


def world_corpus(task: str, n: int, *, seed: int) -> list[str]:
    """The pretraining corpus of `task`'s synthetic world: reviews, comments or documents with summaries."""
    if task == "toxicity":
        from pipeline.data.toxicity_world import generate_comments

        return generate_comments(n, seed=seed)
    if task == "summarization":
        from pipeline.data.summarization_world import generate_documents

        return generate_documents(n, seed=seed)
    from pipeline.data.world import generate_reviews

    return generate_reviews(n, seed=seed)


def base_key(*, world_seed: int, n_reviews: int, base: BaseParams, task: str = "sentiment") -> str:
    """A short digest of everything the base model depends on (task, world seed, corpus size, base params)."""
    payload = {"task": task, "world_seed": world_seed, "n_reviews": n_reviews, "base": dataclasses.asdict(base)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def cached_base(scratch: str | Path, *, world_seed: int, n_reviews: int, base: BaseParams,
                task: str = "sentiment") -> tuple[Path, dict]:
    """Return (folder of the pretrained base model, info), pretraining it first if it is not cached.

    The model is built in a temporary sibling folder and renamed, so an interrupted build leaves
    no half-written model behind. info: {"cached": bool, "seconds": pretraining time in this call
    (0 when cached), "key", "built": {"seconds", "final_loss"} of the build that made the folder}.
    """
    key = base_key(world_seed=world_seed, n_reviews=n_reviews, base=base, task=task)
    out = Path(scratch) / f"base-{task}-{key}"
    if (out / "config.json").is_file():
        built = json.loads((out / BUILD_INFO).read_text()) if (out / BUILD_INFO).is_file() else {}
        return out, {"cached": True, "seconds": 0.0, "key": key, "built": built}
    out.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    try:
        stats = build_base_model(world_corpus(task, n_reviews, seed=world_seed), out_dir=build, seed=world_seed,
                                 base=base, progress=False)
        info = {"seconds": round(stats["seconds"], 2), "final_loss": round(stats["final_loss"], 4)}
        (build / BUILD_INFO).write_text(json.dumps(info, sort_keys=True))
        build.rename(out)
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        raise
    return out, {"cached": False, "key": key, **info, "built": info}
