"""One JSON Lines record: parse a line into a dict, or fail naming the file and line."""
from __future__ import annotations

import json

from pipeline.core.errors import DataError


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
