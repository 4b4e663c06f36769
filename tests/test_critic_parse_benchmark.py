"""The critic-parse benchmark on its hand-labelled set meets its targets, and can fail."""
import json
import shutil
from pathlib import Path

from benchmarks import critic_parse

ROOT = Path(__file__).resolve().parents[1]


def test_labelled_set_meets_the_targets():
    result = critic_parse.run()
    for task, scores in result["tasks"].items():
        assert scores["answers"] >= 30, task
        assert scores["recall"] >= 0.95, (task, scores["failures"])
        assert scores["false_positives"] == 0, (task, scores["failures"])
        assert scores["silent_empty"] == 0, (task, scores["failures"])
        assert scores["status_accuracy"] >= 0.95, (task, scores["failures"])
    assert result["meets_targets"]


def test_a_wrong_label_or_range_is_counted(tmp_path):
    for task in critic_parse.TASKS:
        shutil.copy(critic_parse.DATA / f"{task}.jsonl", tmp_path)
    rows = critic_parse.load_rows("toxicity", tmp_path)
    first = next(row for row in rows if row["expected_spans"])
    first["expected_spans"][0]["start"] += 2  # now the kept span matches nothing expected
    (tmp_path / "toxicity.jsonl").write_text("\n".join(json.dumps(row) for row in rows))
    scores = critic_parse.score_task("toxicity", tmp_path)
    assert scores["recall"] < 1.0 and scores["false_positives"] == 1
    assert [failure["id"] for failure in scores["failures"]] == [first["id"]]
