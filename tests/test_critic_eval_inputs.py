"""Labelled span files: both formats read, and every malformed row named by file and line."""
import json

import pytest

from pipeline.audit.critic_eval import sample_posts
from pipeline.audit.labelled import read_labelled
from pipeline.core.errors import ConfigError, DataError

SEMEVAL = "/work/shared/data/toxicity/semeval2021_toxic_spans/tsd_trial.csv"


def test_semeval_csv_with_multiline_posts(tmp_path):
    path = tmp_path / "posts.csv"
    path.write_text('spans,text\n"[4, 5, 6, 7, 8]","you idiot"\n[],"line one\nline two"\n"[0, 1, 3]","abcd"\n')
    posts = read_labelled(path, labels=("toxic",))
    assert [p.line for p in posts] == [2, 3, 5]  # the second post spans lines 3-4
    assert posts[0].spans == (("toxic", 4, 9),)
    assert posts[1].text == "line one\nline two" and posts[1].spans == ()
    assert posts[2].spans == (("toxic", 0, 2), ("toxic", 3, 4))


def test_the_real_semeval_trial_file():
    posts = read_labelled(SEMEVAL, labels=("toxic",))
    assert len(posts) == 690 and sum(bool(p.spans) for p in posts) == 647  # as in shared/data/SOURCES.md
    assert posts[0].text[15:20] == "moron" and posts[0].spans[0] == ("toxic", 15, 20)


def test_jsonl_with_labels_and_task_fields(tmp_path):
    path = tmp_path / "posts.jsonl"
    rows = [{"text": "good but slow", "spans": [{"start": 0, "end": 4, "label": "positive"},
                                                 {"start": 9, "end": 13, "label": "negative"}], "id": "a"},
            {"text": "A summary.", "spans": [], "query": "The document.", "env_reward": 0.25}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    posts = read_labelled(path, labels=("positive", "negative"))
    assert posts[0].post_id == "a" and posts[0].spans == (("positive", 0, 4), ("negative", 9, 13))
    assert posts[1].post_id == "2" and posts[1].request_row() == {
        "response": "A summary.", "query": "The document.", "env_reward": 0.25}


@pytest.mark.parametrize("name, content, message", [
    ("a.jsonl", '{"text": "hi", "spans": []}\n{"text": "x", "spans": [}\n', "a.jsonl:2: not valid JSON"),
    ("a.jsonl", '{"text": "hi"}\n', "a.jsonl:1: missing key(s) ['spans']"),
    ("a.jsonl", '[1, 2]\n', "a.jsonl:1: a line must be a JSON object"),
    ("a.jsonl", '{"text": "hi", "spans": [{"start": 0, "end": 3, "label": "toxic"}]}\n',
     "a.jsonl:1: spans[0] start=0 end=3 is out of range for a text of 2 characters"),
    ("a.jsonl", '{"text": "hi", "spans": [{"start": 1, "end": 1, "label": "toxic"}]}\n', "start < end"),
    ("a.jsonl", '{"text": "hi", "spans": [{"start": 0, "end": 2, "label": "rude"}]}\n',
     "a.jsonl:1: spans[0] label 'rude' is not a template label; valid: ['toxic']"),
    ("a.jsonl", '{"text": "hi", "spans": [[0, 2]]}\n', "a.jsonl:1: spans[0] is [0, 2]"),
    ("a.jsonl", '{"text": 5, "spans": []}\n', "a.jsonl:1: 'text' must be a string"),
    ("a.jsonl", '{"text": "hi", "spans": [], "env_reward": "high"}\n', "a.jsonl:1: 'env_reward' is 'high'"),
    ("a.jsonl", "\n", "has no posts"),
    ("a.csv", 'text,label\n"hi",1\n', "a.csv:1: missing column(s) ['spans']"),
    ("a.csv", 'spans,text\n"[0, 1]","hi"\n"[2]","hi"\n', "a.csv:3: offset 2 is out of range for a text of 2"),
    ("a.csv", 'spans,text\n"[0, 1","hi"\n', "a.csv:2: spans '[0, 1' is not a JSON list"),
    ("a.csv", 'spans,text\n"[0.5]","hi"\n', "a.csv:2: spans '[0.5]' is not a list of integer offsets"),
    ("a.csv", 'spans,text\n"[0]"\n', "a.csv:2: the row has fewer fields than the header"),
    ("a.tsv", 'spans\ttext\n', "must end in .csv (SemEval offsets) or .jsonl"),
])
def test_malformed_rows_name_the_file_and_line(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DataError) as error:
        read_labelled(path, labels=("toxic",))
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_offsets_without_labels_need_a_one_label_template(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text('spans,text\n"[0]","hi"\n')
    with pytest.raises(DataError, match=r"carry no label, but the template has labels \['positive', 'negative'\]"):
        read_labelled(path, labels=("positive", "negative"))
    with pytest.raises(DataError, match="not found"):
        read_labelled(tmp_path / "missing.csv", labels=("toxic",))


def test_limit_draws_a_seeded_sample_in_file_order():
    posts = read_labelled(SEMEVAL, labels=("toxic",))
    first = sample_posts(posts, limit=50, seed=3)
    assert [p.line for p in first] == [p.line for p in sample_posts(posts, limit=50, seed=3)]
    assert [p.line for p in first] != [p.line for p in sample_posts(posts, limit=50, seed=4)]
    assert [p.line for p in first] == sorted(p.line for p in first) and len(first) == 50
    assert sample_posts(posts, limit=10_000, seed=0) == posts
    with pytest.raises(ConfigError, match="--limit 0"):
        sample_posts(posts, limit=0, seed=0)
