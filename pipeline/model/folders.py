"""The model folders a run loads, checked before any stage computes: `drlc check` and each stage's start.

A key that names a local folder (base.model, score.model, evaluate.reward_model,
evaluate.fluency_model) must hold what `save_pretrained` writes for a model and its tokenizer: a
config.json that parses, weights (*.safetensors, *.bin, *.pt) and tokenizer files. A name that is
not on disk and does not look like a path is a hub id (loaded or downloaded by transformers: not
checked here); one that looks like a path and is missing is an error. GGUF specs (base.model:
`*.gguf`, `pkg:<package>`) are resolved by pipeline/model/gguf.py. Each check raises ConfigError
naming the key, the path and the fix; nothing is written.
"""
from __future__ import annotations

import json
from pathlib import Path

from pipeline.core.errors import ConfigError
from pipeline.model.gguf import is_gguf_spec, resolve_gguf

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
NOT_WEIGHTS = ("training_args.bin", "optimizer.pt", "scheduler.pt")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                   "sentencepiece.bpe.model")
SAVE_HINT = "save the model and its tokenizer there (model.save_pretrained(folder); tokenizer.save_pretrained(folder))"


def looks_like_path(name: str) -> bool:
    """True for a name a hub id cannot be: ./x, /x, ~/x, a/b/c, or a file-like last part (x.y)."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "." in Path(name).name


def check_model_folder(name: str | None, *, key: str) -> None:
    """Raise ConfigError unless `name` is unset, a hub id, or a folder with config, weights and tokenizer."""
    if not name or name.startswith("hub:"):
        return
    path = Path(name).expanduser()
    if not path.exists():
        if looks_like_path(name):
            raise ConfigError(f"'{key}' = {name!r}: no such folder; fix the path in params.yaml (relative paths "
                              f"start at the project root) or give a hub id.")
        return  # a hub id
    if not path.is_dir():
        raise ConfigError(f"'{key}' = {name!r} is a file, not a model folder; point '{key}' at the folder "
                          f"save_pretrained wrote (config.json, weights, tokenizer files).")
    missing = [what for what, present in (
        ("config.json", (path / "config.json").is_file()),
        (f"weights ({', '.join('*' + s for s in WEIGHT_SUFFIXES)})", any(_is_weights(p) for p in path.iterdir())),
        (f"tokenizer files ({', '.join(TOKENIZER_FILES[:4])}, ...)",
         any((path / f).is_file() for f in TOKENIZER_FILES)),
    ) if not present]
    if missing:
        raise ConfigError(f"'{key}' = {name!r}: model folder has no {' and no '.join(missing)}; {SAVE_HINT}.")
    try:
        json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise ConfigError(f"'{key}' = {name!r}: config.json does not parse ({str(error).splitlines()[0]}); "
                          f"{SAVE_HINT}.") from None


def _is_weights(path: Path) -> bool:
    return path.is_file() and path.suffix in WEIGHT_SUFFIXES and path.name not in NOT_WEIGHTS


def check_base_model(params) -> None:
    """'base.model': a GGUF file or package that resolves, or a model folder (check_model_folder)."""
    if is_gguf_spec(params.base.model):
        resolve_gguf(params.base.model, key="base.model")
    else:
        check_model_folder(params.base.model, key="base.model")


def check_eval_models(params) -> None:
    """'evaluate.reward_model' and 'evaluate.fluency_model' ('base' = the run's own base model) where set."""
    check_model_folder(params.evaluate.reward_model, key="evaluate.reward_model")
    if params.evaluate.fluency_model != "base":
        check_model_folder(params.evaluate.fluency_model, key="evaluate.fluency_model")
