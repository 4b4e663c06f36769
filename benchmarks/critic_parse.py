"""Critic parsing: how well parse + align read answers in the layouts real critics write.

The labelled set is ``benchmarks/data/critic_answers/{sentiment,toxicity,summarization}.jsonl``,
written by hand: one answer per line, in varied layouts (drlc's own, the RELC paper's,
Markdown, JSON, chat-model habits: preambles, CRLF, numbering, quote styles, bold,
explanations, wrapped items, per-item labels, "none" wordings), each with

- ``response``: the critiqued text (``document`` too, for summarization),
- ``answer``: the raw critic answer,
- ``leading_label``: the label of the prompt's open last header, or null,
- ``expected_spans``: ``{label, start, end}`` character offsets into ``response`` (every
  occurrence the answer asks for), and ``expected_status`` (ok, none, no_match, parse_error).

Each answer goes through :func:`pipeline.critic.annotate.read_answer` (the labels of the
task's ``prompts/<task>.md``, a reward for every label) and each kept span through
:func:`pipeline.critic.align.find_occurrences`, exactly as in a round. Ranges are compared
with punctuation and whitespace trimmed from both edges. Reported per task:

- ``recall``: share of expected spans found with the right label and range;
- ``false_positives``: kept occurrences that match no expected span;
- ``status_accuracy``: share of answers whose status is the expected one;
- ``silent_empty``: answers that name spans but come back ``ok`` or ``none`` with no span kept.

Targets: recall >= 0.95, 0 false positives, 0 silent-empty answers.

Run: ``python benchmarks/critic_parse.py [--out benchmarks/results/critic_parse.json]`` (about a second).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pipeline.critic.align import find_occurrences
from pipeline.critic.annotate import read_answer
from pipeline.critic.templates import load_template

REPO = Path(__file__).resolve().parents[1]

DATA = REPO / "benchmarks" / "data" / "critic_answers"
TASKS = ("sentiment", "toxicity", "summarization")
TARGETS = {"recall": 0.95, "false_positives": 0, "silent_empty": 0}
_EDGE = " \t\r\n\"'“”‘’«»`*_.,;:!?…()[]-–—"


def load_rows(task: str, data_dir: Path = DATA) -> list[dict]:
    """The labelled answers of one task."""
    path = data_dir / f"{task}.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def trimmed(text: str, start: int, end: int) -> tuple[int, int]:
    """``(start, end)`` with punctuation and whitespace removed from both edges."""
    while start < end and text[start] in _EDGE:
        start += 1
    while end > start and text[end - 1] in _EDGE:
        end -= 1
    return start, end


def score_row(row: dict, labels: tuple[str, ...]) -> dict:
    """Read one answer; return its status, kept occurrences and how they compare with the labels."""
    response = row["response"]
    elsewhere = {"document": row["document"]} if row.get("document") else None
    read = read_answer(row["answer"], labels=labels, leading_label=row.get("leading_label"), response=response,
                       rewards={label: 1.0 for label in labels}, elsewhere=elsewhere)
    kept = {(label, *trimmed(response, start, end))
            for label, text in read.kept for start, end in find_occurrences(response, text)}
    expected = {(span["label"], *trimmed(response, span["start"], span["end"])) for span in row["expected_spans"]}
    return {
        "id": row["id"], "status": read.status, "expected_status": row["expected_status"],
        "found": len(expected & kept), "expected": len(expected), "false_positives": sorted(kept - expected),
        "missed": sorted(expected - kept),
        "silent_empty": bool(row["expected_spans"]) and not kept and read.status in ("ok", "none"),
    }


def score_task(task: str, data_dir: Path = DATA) -> dict:
    """Recall, false positives, status accuracy and silent-empty answers of one task's set."""
    labels = load_template(REPO / "prompts" / f"{task}.md").labels
    rows = [score_row(row, labels) for row in load_rows(task, data_dir)]
    expected = sum(r["expected"] for r in rows)
    return {
        "answers": len(rows),
        "expected_spans": expected,
        "recall": sum(r["found"] for r in rows) / expected if expected else 1.0,
        "false_positives": sum(len(r["false_positives"]) for r in rows),
        "status_accuracy": sum(r["status"] == r["expected_status"] for r in rows) / len(rows),
        "silent_empty": sum(r["silent_empty"] for r in rows),
        "failures": [r for r in rows if r["missed"] or r["false_positives"] or r["status"] != r["expected_status"]],
    }


def run(data_dir: Path = DATA) -> dict:
    """Score every task; ``meets_targets`` says whether all of them meet :data:`TARGETS`."""
    tasks = {task: score_task(task, data_dir) for task in TASKS}
    meets = all(t["recall"] >= TARGETS["recall"] and t["false_positives"] <= TARGETS["false_positives"]
                and t["silent_empty"] <= TARGETS["silent_empty"] for t in tasks.values())
    return {"benchmark": "critic_parse", "targets": TARGETS, "tasks": tasks, "meets_targets": meets}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "critic_parse.json"))
    args = parser.parse_args()
    result = run()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    for task, scores in result["tasks"].items():
        print(f"{task:14s} answers {scores['answers']:3d}  recall {scores['recall']:.3f}  "
              f"false positives {scores['false_positives']}  status accuracy {scores['status_accuracy']:.3f}  "
              f"silent empty {scores['silent_empty']}")
    print(f"meets targets: {result['meets_targets']}  ->  {args.out}")


if __name__ == "__main__":
    main()
