"""The data files a run reads, checked before any stage computes: `drlc check` and each stage's start.

A file must exist, be non-empty and be UTF-8 throughout (JSONL, CSV), and its first record must
parse: a JSON object (JSONL), a header and a row (CSV), a readable footer and first row group
(Parquet). A folder must hold at least one such file, each checked; a datasets ``save_to_disk``
folder only has to exist. ``hub:`` sources are not checked (they need the network).
Each check raises a DataError naming the params key, the file and the fix; nothing is written.
"""
from __future__ import annotations

import codecs
from pathlib import Path

from pipeline.core.cache import outside_path
from pipeline.core.config import Params
from pipeline.core.errors import DataError
from pipeline.core.jsonl import json_object, not_utf8
from pipeline.data.hub import HUB_PREFIX, is_saved_dataset
from pipeline.data.local import FILE_SUFFIXES, SUFFIXES

_CHUNK = 1 << 20


def check_world_source(params: Params) -> None:
    """'world.source': the synthetic world, a hub dataset, or local data checked by check_data_path."""
    source = params.world.source
    if source != "world" and not source.startswith(HUB_PREFIX):
        check_data_path(source, key="world.source")
    eval_source = params.world.eval_source
    if eval_source and not eval_source.startswith(HUB_PREFIX):
        check_data_path(eval_source, key="world.eval_source")


def check_eval_prompts(params: Params) -> None:
    """Each JSONL file of 'evaluate.prompts' (the entry 'world' is the prepare stage's own split)."""
    for source in params.evaluate.prompts:
        if source != "world":
            check_data_path(source, key="evaluate.prompts")


def check_score_data(params: Params) -> None:
    """'score.train_data', the data a fitted scorer learns from, where set."""
    if params.score.train_data:
        check_data_path(params.score.train_data, key="score.train_data")


def check_data_files(params: Params) -> None:
    """Every local data file of the run (the three checks above)."""
    for check in (check_world_source, check_eval_prompts, check_score_data):
        check(params)


def check_data_path(source: str, *, key: str) -> None:
    """Raise DataError unless `source` (a file, a folder of data files, or `DIR[:split]` of a saved dataset)
    is there, non-empty, UTF-8 and parses at its first record."""
    source = outside_path(source)
    path = Path(source)
    head, _, split = source.rpartition(":")
    if not path.exists() and head and split and is_saved_dataset(Path(head)):
        return
    if is_saved_dataset(path):
        return
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in SUFFIXES)
        if not files:
            raise DataError(f"'{key}' = {source!r}: folder has no {'/'.join(SUFFIXES)} file; put the data files "
                            f"there or point '{key}' at a file.")
        for file in files:
            check_data_file(file, key=key)
        return
    if not path.is_file():
        raise DataError(f"'{key}' = {source!r}: no such file or folder; fix the path in params.yaml "
                        f"(relative paths start at the project root).")
    check_data_file(path, key=key)


def check_data_file(path: Path, *, key: str) -> None:
    """One data file: non-empty, a known suffix, UTF-8 (text formats), a first record that parses."""
    if path.suffix not in FILE_SUFFIXES:
        raise DataError(f"'{key}': data file '{path}' has suffix '{path.suffix}'; use one of {FILE_SUFFIXES}.")
    if path.stat().st_size == 0:
        raise DataError(f"'{key}': data file '{path}' is empty; point '{key}' at a file with records.")
    if path.suffix == ".parquet":
        _check_parquet(path, key=key)
        return
    check_utf8(path)
    first = _first_line(path)
    if first is None:
        raise DataError(f"'{key}': data file '{path}' has only blank lines; point '{key}' at a file with records.")
    number, line = first
    if path.suffix == ".csv":
        if _first_line(path, skip=number) is None:
            raise DataError(f"'{key}': CSV file '{path}' has a header and no rows; add rows or fix the path.")
        return
    if path.suffix == ".txt":
        return
    json_object(f"{path}:{number}", line, expected="a JSON object")


def check_utf8(path: Path) -> None:
    """Raise DataError at the first byte of `path` that is not UTF-8 (file, line, byte offset), reading in chunks."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, line = 0, 1
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as error:
                bad = error.start
                raise DataError(not_utf8(path, line + chunk.count(b"\n", 0, bad), offset + bad, chunk[bad])) from None
            offset, line = offset + len(chunk), line + chunk.count(b"\n")
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError as error:  # a multi-byte character cut off at the end of the file
            raise DataError(not_utf8(path, line, offset - len(error.object) + error.start,
                                     error.object[error.start])) from None


def _first_line(path: Path, skip: int = 0) -> tuple[int, str] | None:
    """The first non-blank line after line `skip`, with its number, or None."""
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if number > skip and line.strip():
                return number, line
    return None


def _check_parquet(path: Path, *, key: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(path)
        if file.metadata.num_row_groups:
            file.read_row_group(0)
    except (pa.ArrowException, OSError) as error:
        raise DataError(f"'{key}': Parquet file '{path}' cannot be read ({str(error).splitlines()[0]}); "
                        f"replace it with a good copy.") from None
    if file.metadata.num_rows == 0:
        raise DataError(f"'{key}': Parquet file '{path}' has no rows; point '{key}' at a file with records.")

