"""Data sources for the local-data and paper profiles, read as records (dicts).

`world.source` names one of:
- a JSONL, CSV or Parquet file, or a folder of them (every .jsonl/.json/.csv/.parquet file in
  it, sorted by name), e.g. the hub's imdb ``train-*.parquet`` files saved locally;
- a plain-text file (``.txt``, named as a file, never picked up from a folder): one record
  ``{"text": line}`` per non-blank line (CommonGen's ``src_alpha`` concept sets);
- a folder written by datasets' ``save_to_disk`` (``DIR`` or ``DIR:<split>`` for a DatasetDict;
  pipeline/data/hub.py);
- ``hub:<dataset id>[:<split>]``: ``datasets.load_dataset`` from the Hugging Face hub (network).
Nested fields are addressed with dots: ``prompt.text``.
"""
from __future__ import annotations

import random
from pathlib import Path

from pipeline.core.cache import outside_path
from pipeline.core.errors import DataError
from pipeline.core.jsonl import json_object, text_lines

SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")  # the data files of a folder source
FILE_SUFFIXES = SUFFIXES + (".txt",)  # a source named as one file may also be plain text


def read_records(source: str) -> list[dict]:
    """All records of `source` (see the module docstring), in file and row order.

    Raises: DataError naming the source when it is missing, has no supported file, cannot be
    loaded from the hub, or a JSONL line is not a JSON object.
    """
    from pipeline.data.hub import HUB_PREFIX, hub_records, is_saved_dataset, saved_records

    if source.startswith(HUB_PREFIX):
        return hub_records(source)
    source = outside_path(source)  # ../data beside the project, also from a DVC experiment's copy
    path, split = Path(source), None
    head, _, tail = source.rpartition(":")
    if not path.exists() and head and tail and is_saved_dataset(Path(head)):
        path, split = Path(head), tail
    if is_saved_dataset(path):
        return saved_records(path, split, source=source)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in SUFFIXES)
        if not files:
            raise DataError(f"Data folder '{path}' has no {'/'.join(SUFFIXES)} file and is not a save_to_disk "
                            f"folder: put the data files there or set 'world.source' to a file.")
        return [record for file in files for record in _file_records(file)]
    if not path.is_file():
        raise DataError(f"Data file '{path}' not found: set 'world.source' to 'world', an existing "
                        f"{'/'.join(SUFFIXES)} file or folder, a save_to_disk folder or hub:<dataset id>.")
    return _file_records(path)


def _file_records(path: Path) -> list[dict]:
    if path.suffix in (".jsonl", ".json"):
        return [json_object(f"{path}:{number}", line, expected="a JSON object")
                for number, line in text_lines(path) if line.strip()]
    if path.suffix == ".csv":
        import pandas as pd

        for _ in text_lines(path):  # a byte that is not UTF-8 fails here with its line, not in pandas
            pass
        return pd.read_csv(path, keep_default_na=False).to_dict("records")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if path.suffix == ".txt":
        return [{"text": line.strip()} for _, line in text_lines(path) if line.strip()]
    raise DataError(f"Data file '{path}' has suffix '{path.suffix}': use one of {FILE_SUFFIXES}.")


def field(record: dict, name: str):
    """record[name], following dots into nested dicts; None if any part is missing."""
    value = record
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def pick_column(records: list[dict], candidates: tuple[str, ...], *, source: str, what: str) -> str:
    """The first candidate column the first record has. Raises DataError naming the file and the fix."""
    if not records:
        raise DataError(f"Data source '{source}' has no records: point 'world.source' at a non-empty file.")
    for name in candidates:
        if field(records[0], name) is not None:
            return name
    columns = sorted(records[0])
    raise DataError(f"Data source '{source}' has no {what} column: expected one of {list(candidates)}, "
                    f"found {columns}; rename the column or convert the file.")


def split_items(items: list, *, n_train: int, n_eval: int, seed: int, source: str) -> dict[str, list]:
    """Shuffle (seeded) and cut into eval (first n_eval) and train (next n_train, fewer if short).

    Raises: DataError if fewer than n_eval + 1 items remain (an empty train split).
    """
    if len(items) <= n_eval:
        raise DataError(f"Data source '{source}' gives {len(items)} usable prompts after filtering, not enough "
                        f"for {n_eval} eval prompts and a train split: use a larger file or lower "
                        f"'world.n_eval_prompts'.")
    shuffled = list(items)
    random.Random(f"drlc-split:{seed}").shuffle(shuffled)
    return {"train": shuffled[n_eval:n_eval + n_train], "eval": shuffled[:n_eval]}
