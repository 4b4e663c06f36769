"""Generated blocks of docs/results.md: the text between a start and an end marker is replaced whole.

Each benchmark that owns a block there (demo queries, the `drlc study` grids, the length sweeps, the real-text
study) renders it from a committed result JSON; a test renders it again and compares, so the numbers on the page
cannot drift from the JSON.
"""
from __future__ import annotations

import json
from pathlib import Path

from pipeline.core.errors import DataError


def splice(text: str, section: str, start: str, end: str) -> str:
    """`text` with the part between `start` and `end` replaced by `section` (one newline either side).

    Raises: DataError unless each marker occurs exactly once, start before end.
    """
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise DataError(f"the page must hold '{start}' and then '{end}', exactly once each; add both markers "
                        "where the generated section should go")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{section.rstrip(chr(10))}\n{end}{tail}"


def splice_file(path: str | Path, section: str, start: str, end: str) -> None:
    """Rewrite the Markdown file at `path` with `section` between `start` and `end` (see `splice`).

    Raises: DataError as `splice`, leaving the file as it was.
    """
    path = Path(path)
    path.write_text(splice(path.read_text(encoding="utf-8"), section, start, end), encoding="utf-8")



def publish(result: dict, json_path: Path, section: str, doc: str | Path | None, start: str, end: str) -> None:
    """Commit-ready outputs of a benchmark: `result` as indented JSON at json_path, `section` (rendered from
    that result) spliced into the page `doc` between the markers when one is given, and printed."""
    Path(json_path).write_text(json.dumps(result, indent=1) + "\n")
    if doc:
        splice_file(doc, section, start, end)
    print(section)
