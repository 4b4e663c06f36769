"""Local data files for the local-data and paper profiles: JSONL, CSV or Parquet, read as records.

`world.source` names a file, a folder (every .jsonl/.csv/.parquet file in it, sorted by name)
or ``hf:<dataset id>[:<split>]``, which needs the optional `datasets` package and network. A
paper profile can instead point at the dataset's files saved locally in the hub's schema
(e.g. imdb's ``train-*.parquet``), which is how the paper builders are tested offline.
Nested JSON fields are addressed with dots: ``prompt.text``.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from pipeline.errors import DataError

SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")


def read_records(source: str) -> list[dict]:
    """All records of `source` (file, folder or hf:<id>[:<split>]), in file and row order.

    Raises: DataError naming the path when it is missing, has no supported file, or a JSONL
    line is not a JSON object.
    """
    if source.startswith("hf:"):
        return _hub_records(source)
    path = Path(source)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in SUFFIXES)
        if not files:
            raise DataError(f"Data folder '{path}' has no {'/'.join(SUFFIXES)} file: put the data files there "
                            f"or set 'world.source' to a file.")
        return [record for file in files for record in _file_records(file)]
    if not path.is_file():
        raise DataError(f"Data file '{path}' not found: set 'world.source' to 'world' or an existing "
                        f"{'/'.join(SUFFIXES)} file.")
    return _file_records(path)


def _file_records(path: Path) -> list[dict]:
    if path.suffix in (".jsonl", ".json"):
        records = []
        with path.open(encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    raise DataError(f"{path}:{number}: not valid JSON ({err.msg}); one object per line.") from None
                if not isinstance(record, dict):
                    raise DataError(f"{path}:{number}: expected a JSON object per line.")
                records.append(record)
        return records
    if path.suffix == ".csv":
        import pandas as pd

        return pd.read_csv(path, keep_default_na=False).to_dict("records")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    raise DataError(f"Data file '{path}' has suffix '{path.suffix}': use one of {SUFFIXES}.")


def _hub_records(source: str) -> list[dict]:
    _, dataset, *split = source.split(":")
    try:
        import datasets
    except ImportError:
        raise DataError(f"'world.source' = {source!r} needs the `datasets` package (pip install datasets) and "
                        f"network; or save the dataset's files locally and set 'world.source' to them.") from None
    return list(datasets.load_dataset(dataset, split=split[0] if split else "train"))


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
