"""Human-labelled span sets: the gold standard a critic is audited against.

Two formats, chosen by the file name's ending:

- ``.csv``, the SemEval-2021 Task 5 format: columns ``spans`` (a JSON list of character
  offsets that are labelled, e.g. ``"[8, 9, 10]"``; ``[]`` = none) and ``text``; other
  columns are ignored. The offsets carry no label, so the template must have exactly one
  (toxicity's ``toxic``). Gold spans are the maximal runs of consecutive offsets.
- ``.jsonl``, drlc's format for any task and label set: one object per line with ``text``
  (string) and ``spans`` (a list of ``{"start": int, "end": int, "label": str}``, end
  exclusive), and optionally ``id`` (string), ``query`` (string: e.g. the document a
  summary was written from) and ``env_reward`` (number: the score the critic is shown).
  ``query`` and ``env_reward`` fill the template exactly as a rollout's would.

Nothing else is assumed about the file. A malformed row raises :class:`DataError` naming
the file, the line and what is wrong.
"""
from __future__ import annotations

import csv
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from pipeline.audit.span_metrics import offset_runs
from pipeline.core.errors import DataError
from pipeline.core.jsonl import json_object

__all__ = ["LabelledPost", "read_labelled"]


@dataclass(frozen=True)
class LabelledPost:
    """One post with its gold spans ``(label, start, end)``.

    ``line`` is the file line where the post starts (1-based); ``post_id`` is the row's
    ``id`` or, without one, the line number as text.
    """

    line: int
    post_id: str
    text: str
    spans: tuple[tuple[str, int, int], ...]
    query: str = ""
    env_reward: float = 0.0

    def request_row(self) -> dict:
        """The post as the rollout row a task's ``critic_fields`` reads."""
        return {"response": self.text, "query": self.query, "env_reward": self.env_reward}


def read_labelled(path: str | Path, *, labels: tuple[str, ...]) -> list[LabelledPost]:
    """Read a labelled span file (``.csv`` SemEval offsets or ``.jsonl``); see the module doc.

    :param path: the file
    :param labels: the critic template's labels; every gold label must be one of them
    :return: the posts in file order
    :raises DataError: the file is missing, empty, of another format, or has a malformed row
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"labelled span file '{path}' not found; pass a SemEval .csv or a drlc .jsonl file")
    if path.suffix == ".csv":
        posts = _read_csv(path, labels)
    elif path.suffix == ".jsonl":
        posts = _read_jsonl(path, labels)
    else:
        raise DataError(f"labelled span file '{path}' must end in .csv (SemEval offsets) or .jsonl (drlc spans)")
    if not posts:
        raise DataError(f"labelled span file '{path}' has no posts")
    return posts


def _read_csv(path: Path, labels: tuple[str, ...]) -> list[LabelledPost]:
    if len(labels) != 1:
        raise DataError(f"{path}: SemEval offset files carry no label, but the template has labels {list(labels)}; "
                        "use the .jsonl format with a label per span")
    csv.field_size_limit(sys.maxsize)
    posts = []
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in ("spans", "text") if c not in (reader.fieldnames or [])]
        if missing:
            raise DataError(f"{path}:1: missing column(s) {missing}; a SemEval file has columns spans,text")
        line = reader.line_num + 1
        for row in reader:
            posts.append(_csv_post(path, line, row, labels[0]))
            line = reader.line_num + 1
    return posts


def _csv_post(path: Path, line: int, row: dict, label: str) -> LabelledPost:
    where = f"{path}:{line}"
    text, raw = row.get("text"), row.get("spans")
    if text is None or raw is None:
        raise DataError(f"{where}: the row has fewer fields than the header; quote fields that hold commas")
    try:
        offsets = json.loads(raw)
    except json.JSONDecodeError:
        raise DataError(f"{where}: spans {raw[:60]!r} is not a JSON list of offsets like [8, 9, 10]") from None
    if not isinstance(offsets, list) or not all(type(i) is int for i in offsets):
        raise DataError(f"{where}: spans {raw[:60]!r} is not a list of integer offsets like [8, 9, 10]")
    bad = [i for i in offsets if not 0 <= i < len(text)]
    if bad:
        raise DataError(f"{where}: offset {bad[0]} is out of range for a text of {len(text)} characters "
                        f"(valid: 0..{len(text) - 1})")
    return LabelledPost(line=line, post_id=str(line), text=text, spans=tuple(offset_runs(offsets, label)))


def _read_jsonl(path: Path, labels: tuple[str, ...]) -> list[LabelledPost]:
    posts = []
    with path.open(encoding="utf-8") as f:
        for line, content in enumerate(f, start=1):
            if content.strip():
                posts.append(_jsonl_post(f"{path}:{line}", line, content, labels))
    return posts


def _jsonl_post(where: str, line: int, content: str, labels: tuple[str, ...]) -> LabelledPost:
    row = json_object(where, content, expected="a JSON object with 'text' and 'spans'")
    missing = [key for key in ("text", "spans") if key not in row]
    if missing:
        raise DataError(f"{where}: missing key(s) {missing}; a line needs 'text' and 'spans'")
    text, spans = row["text"], row["spans"]
    if not isinstance(text, str) or not isinstance(spans, list):
        raise DataError(f"{where}: 'text' must be a string and 'spans' a list of {{start, end, label}}")
    for key, kind in (("id", str), ("query", str), ("env_reward", (int, float))):
        if key in row and (not isinstance(row[key], kind) or isinstance(row[key], bool)):
            raise DataError(f"{where}: '{key}' is {row[key]!r}; it must be a {getattr(kind, '__name__', 'number')}")
    if not math.isfinite(row.get("env_reward", 0.0)):
        raise DataError(f"{where}: 'env_reward' is {row['env_reward']!r}; it must be a finite number")
    gold = tuple(_jsonl_span(where, k, span, text, labels) for k, span in enumerate(spans))
    return LabelledPost(line=line, post_id=row.get("id", str(line)), text=text, spans=gold,
                        query=row.get("query", ""), env_reward=float(row.get("env_reward", 0.0)))


def _jsonl_span(where: str, k: int, span, text: str, labels: tuple[str, ...]) -> tuple[str, int, int]:
    if not isinstance(span, dict) or not {"start", "end", "label"} <= span.keys():
        raise DataError(f"{where}: spans[{k}] is {span!r}; each span is {{\"start\": int, \"end\": int, \"label\": str}}")
    start, end, label = span["start"], span["end"], span["label"]
    if type(start) is not int or type(end) is not int or not 0 <= start < end <= len(text):
        raise DataError(f"{where}: spans[{k}] start={start!r} end={end!r} is out of range for a text of "
                        f"{len(text)} characters (need integers 0 <= start < end <= {len(text)})")
    if label not in labels:
        raise DataError(f"{where}: spans[{k}] label {label!r} is not a template label; valid: {list(labels)}")
    return label, start, end
