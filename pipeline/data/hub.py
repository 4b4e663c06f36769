"""Hugging Face datasets as records: ``hub:<dataset id>[:<split>]`` and folders written by ``save_to_disk``.

The paper profiles read the hub's datasets (``stanfordnlp/imdb``, ``allenai/real-toxicity-prompts``,
``CarperAI/openai_summarize_tldr``) with ``datasets.load_dataset``, which needs network. Where
there is none, save the dataset once where there is (``load_dataset(id).save_to_disk(DIR)``)
and point ``world.source`` at DIR (``DIR:<split>`` picks a split of a saved DatasetDict; the
default is ``train``). Records are plain dicts; nested features (RTP's ``prompt``) stay nested.
"""
from __future__ import annotations

from pathlib import Path

from pipeline.core.errors import DataError

HUB_PREFIX = "hub:"
DEFAULT_SPLIT = "train"
SAVED_DATASET_FILES = ("dataset_info.json", "state.json", "dataset_dict.json")


def is_saved_dataset(path: Path) -> bool:
    """True when `path` is a folder written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``."""
    return path.is_dir() and any((path / name).is_file() for name in SAVED_DATASET_FILES)


def hub_records(source: str) -> list[dict]:
    """The records of ``hub:<dataset id>[:<split>]`` (split default "train") via ``datasets.load_dataset``.

    Raises: DataError naming the source when the dataset or split cannot be loaded (offline, unknown
    id or split), with the fix: a local ``save_to_disk`` copy.
    """
    dataset_id, _, split = source[len(HUB_PREFIX):].partition(":")
    if not dataset_id:
        raise DataError(f"'world.source' = {source!r} names no dataset: use hub:<dataset id>[:<split>], "
                        f"e.g. hub:stanfordnlp/imdb:train.")
    import datasets

    try:
        dataset = datasets.load_dataset(dataset_id, split=split or DEFAULT_SPLIT)
    except Exception as err:  # datasets raises many types (ConnectionError, ValueError, FileNotFoundError...)
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DataError(f"'world.source' = {source!r}: could not load split {split or DEFAULT_SPLIT!r} of "
                        f"{dataset_id!r} from the Hugging Face hub ({reason}); without network, run "
                        f"datasets.load_dataset({dataset_id!r}).save_to_disk(DIR) where there is network and set "
                        f"'world.source' to DIR (or DIR:<split>).") from err
    return dataset.to_list()


def saved_records(path: Path, split: str | None, *, source: str) -> list[dict]:
    """The records of a ``save_to_disk`` folder: a Dataset, or one split of a DatasetDict.

    Params: path: the folder; split: the DatasetDict split (None = "train"; must be None for a
    single Dataset); source: the ``world.source`` value, for messages.
    Raises: DataError naming the source for an unreadable folder, a missing split (listing the
    splits) or a split given for a single Dataset.
    """
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except (OSError, ValueError) as err:
        raise DataError(f"'world.source' = {source!r}: '{path}' is not a readable save_to_disk folder ({err}); "
                        f"save the dataset again with save_to_disk.") from err
    if isinstance(loaded, datasets.DatasetDict):
        name = split or DEFAULT_SPLIT
        if name not in loaded:
            raise DataError(f"'world.source' = {source!r}: the saved dataset has no split {name!r}; its splits are "
                            f"{sorted(loaded)}: set 'world.source' to '{path}:<split>'.")
        return loaded[name].to_list()
    if split is not None:
        raise DataError(f"'world.source' = {source!r}: '{path}' holds a single split, so ':{split}' cannot be "
                        f"chosen; set 'world.source' to '{path}'.")
    return loaded.to_list()
