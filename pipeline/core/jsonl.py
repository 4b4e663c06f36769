"""JSON Lines: read a file's lines as UTF-8, and parse one line into a dict, or fail naming the file and line."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from pipeline.core.errors import DataError


def text_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(line number from 1, decoded line) for each line of a UTF-8 text file.

    :raises DataError: a line is not UTF-8, naming the file, the line, the byte offset in the
        file and the bad byte (Python's own UnicodeDecodeError names none of them)
    """
    offset = 0
    with Path(path).open("rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise DataError(not_utf8(path, number, offset + error.start, raw[error.start])) from None
            offset += len(raw)


def not_utf8(path: str | Path, line: int, offset: int, byte: int) -> str:
    """The one-line error for a byte that is not UTF-8."""
    return (f"{path}:{line}: byte 0x{byte:02x} at byte offset {offset} is not UTF-8; re-encode the file as UTF-8 "
            f"(e.g. iconv -f latin1 -t utf-8 {path} > fixed.jsonl)")


def json_object(where: str, line: str, *, expected: str) -> dict:
    """Return the JSON object on one line of a JSONL file.

    :param where: ``"<path>:<line number>"``, the start of every error message
    :param line: the line's text
    :param expected: what a line must hold, for the error (e.g. "a JSON object with 'text' and 'spans'")
    :raises DataError: the line is not valid JSON, or not a JSON object
    """
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise DataError(f"{where}: not valid JSON ({error.msg} at column {error.colno}); one object per line") from None
    if not isinstance(record, dict):
        raise DataError(f"{where}: a line must be {expected}, got {type(record).__name__}")
    return record
