"""Evaluation prompt sets: the world's eval prompts or DExperts-format JSONL files (a task file: its own reader).

A DExperts prompts file has one JSON object per line with the prompt under `prompt.text`
(e.g. `{"prompt": {"text": "God never intended to"}, ...}`); other fields are ignored. A set
is named after its file's stem ("neutral_prompts") or "world". `n_prompts` keeps the first
n prompts of each set (DExperts' `sample_size`); None keeps all.
"""
from __future__ import annotations

import json
from pathlib import Path

from pipeline.core.errors import DataError
from pipeline.core.jsonl import text_lines

WORLD = "world"


def read_dexperts_prompts(path: str | Path, n_prompts: int | None = None) -> list[dict]:
    """Rows {prompt_id, text} from a DExperts JSONL file, prompt_id = 0-based line index.

    Raises: DataError naming the file, line and field when the file is missing, a line is not
    a JSON object or `prompt.text` is missing or not a non-empty string.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"Prompts file '{path}' not found: set 'evaluate.prompts' to 'world' or existing JSONL files.")
    rows = []
    for number, line in text_lines(path):
        if n_prompts is not None and len(rows) >= n_prompts:
            break
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{number}: not valid JSON ({err.msg}); one JSON object per line.") from None
        prompt = record.get("prompt") if isinstance(record, dict) else None
        text = prompt.get("text") if isinstance(prompt, dict) else None
        if not isinstance(text, str) or not text:
            raise DataError(f"{path}:{number}: missing field 'prompt.text' (a non-empty string), "
                            f'as in {{"prompt": {{"text": "..."}}}}.')
        rows.append({"prompt_id": str(number - 1), "text": text})
    if not rows:
        raise DataError(f"Prompts file '{path}' has no prompts.")
    return rows


def load_prompt_sets(sources: list[str], world_rows: list[dict], n_prompts: int | None,
                     read=None) -> dict[str, list[dict]]:
    """{set name: rows {prompt_id, text[, reference, columns]}} for each source ('world' or a file), in order.

    read: the task's reader of a prompts file, (source, n_prompts) -> rows, when it has one: a task
    file's eval prompts go through its prompt() as its training prompts do, with the same columns
    (pipeline/tasks/_from_file.py); None reads DExperts JSONL.
    Raises: DataError if two sources share a name or the world has no eval prompts.
    """
    sets: dict[str, list[dict]] = {}
    for source in sources:
        name = WORLD if source == WORLD else Path(source).stem
        if name in sets:
            raise DataError(f"Two prompt sets are both named '{name}' in 'evaluate.prompts': rename one file.")
        if source == WORLD:
            rows = [{"prompt_id": r["prompt_id"], "text": r["text"],  # reference: summarization only
                     **({"reference": r["reference"]} if r.get("reference") else {}),
                     **({"columns": r["columns"]} if r.get("columns") else {})}  # a task file's prompt fields
                    for r in world_rows if r["split"] == "eval"]
            if not rows:
                raise DataError("The prompts table has no 'eval' rows: re-run the prepare stage.")
            sets[name] = rows[:n_prompts]
        else:
            sets[name] = read(source, n_prompts) if read is not None else read_dexperts_prompts(source, n_prompts)
    return sets
