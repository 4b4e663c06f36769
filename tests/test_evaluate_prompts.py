"""Evaluation prompt sets: DExperts JSONL files and the world's eval prompts; bad files."""
import json
from pathlib import Path

import pytest

from pipeline.core.errors import DataError, exit_on_error
from pipeline.evaluate.prompts import load_prompt_sets, read_dexperts_prompts

ROOT = Path(__file__).resolve().parents[1]
SHARED = next((p for p in (ROOT.parent / "shared", Path("/work/shared")) if (p / "data/sentiment").is_dir()), None)
WORLD_ROWS = [{"prompt_id": "e0", "split": "eval", "text": "The plot"}, {"prompt_id": "t0", "split": "train", "text": "I"},
              {"prompt_id": "e1", "split": "eval", "text": "Overall, the"}]


def _jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_reads_prompt_text_and_keeps_the_first_n(tmp_path):
    path = _jsonl(tmp_path / "neutral_prompts.jsonl",
                  [{"prompt": {"text": "God never"}, "num_positive": 3}, {"prompt": {"text": "We are"}}, {"prompt": {"text": "C"}}])
    assert read_dexperts_prompts(path) == [{"prompt_id": "0", "text": "God never"}, {"prompt_id": "1", "text": "We are"},
                                           {"prompt_id": "2", "text": "C"}]
    assert [r["text"] for r in read_dexperts_prompts(path, 2)] == ["God never", "We are"]


@pytest.mark.parametrize("line, message", [
    ({"continuation": {"text": "x"}}, r"p.jsonl:2: missing field 'prompt.text'"),
    ({"prompt": {"txt": "x"}}, r"p.jsonl:2: missing field 'prompt.text'"),
    ({"prompt": {"text": ""}}, r"p.jsonl:2: missing field 'prompt.text'"),
    ('{"prompt": ', r"p.jsonl:2: not valid JSON"),
    ('["a list"]', r"p.jsonl:2: missing field 'prompt.text'"),
])
def test_bad_lines_name_file_line_and_field(tmp_path, line, message):
    path = _jsonl(tmp_path / "p.jsonl", [{"prompt": {"text": "ok"}}, line])
    with pytest.raises(DataError, match=message):
        read_dexperts_prompts(path)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(DataError, match="not found"):
        read_dexperts_prompts(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="has no prompts"):
        read_dexperts_prompts(tmp_path / "empty.jsonl")


def test_prompt_sets_world_and_files_by_name(tmp_path):
    path = _jsonl(tmp_path / "negative_prompts.jsonl", [{"prompt": {"text": "a"}}, {"prompt": {"text": "b"}}])
    sets = load_prompt_sets(["world", str(path)], WORLD_ROWS, n_prompts=1)
    assert sets == {"world": [{"prompt_id": "e0", "text": "The plot"}], "negative_prompts": [{"prompt_id": "0", "text": "a"}]}
    assert len(load_prompt_sets(["world"], WORLD_ROWS, None)["world"]) == 2
    with pytest.raises(DataError, match="both named 'negative_prompts'"):
        load_prompt_sets([str(path), str(path)], WORLD_ROWS, None)
    with pytest.raises(DataError, match="no 'eval' rows"):
        load_prompt_sets(["world"], WORLD_ROWS[1:2], None)


@pytest.mark.skipif(SHARED is None, reason="shared/data exists only on dev/CI machines")
def test_reads_the_dexperts_sentiment_prompt_files():
    for name, n_lines in [("neutral_prompts", 5000), ("negative_prompts", 2500), ("positive_prompts", 2500)]:
        rows = read_dexperts_prompts(SHARED / f"data/sentiment/{name}.jsonl")
        assert len(rows) == n_lines and all(r["text"] for r in rows)
    assert read_dexperts_prompts(SHARED / "data/sentiment/neutral_prompts.jsonl", 1)[0]["text"] == "God never intended to"


def test_a_bad_prompts_file_exits_2_with_one_line(tmp_path, capsys):
    path = _jsonl(tmp_path / "p.jsonl", [{"nothing": 1}])
    with pytest.raises(SystemExit) as exited:  # the interpreter's exit status is SystemExit's code
        exit_on_error(lambda: read_dexperts_prompts(str(path)))
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"drlc: error: {path}:1: missing field 'prompt.text' "
                                                            '(a non-empty string), as in {"prompt": {"text": "..."}}.']
