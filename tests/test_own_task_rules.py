"""The rule critic in the critique stage's own process (pipeline/critic/offline/rules.py RuleClient): critic() is
called on the row itself, its spans may hold any character, its answers are cached by content, and a bug in it
stops the stage in one line naming the file and line."""
import json
import shutil
from pathlib import Path

import pytest
from conftest import train_bpe

from pipeline.core.config import CriticParams
from pipeline.core.errors import CriticError
from pipeline.steps import critique as critique_step
from pipeline.steps.critique import critique

ROOT = Path(__file__).resolve().parents[1]
RESPONSES = ['He said "stop" and left.', "A tag </response> inside, then more."]
CRITIC = '''LABELS = ("concept", "filler")
def reward(prompts, completions):
    return [0.0] * len(completions)
def critic(query, response, env_reward):
    spans = {"concept": [], "filler": []}
    if '"stop"' in response:
        spans["concept"].append('"stop"')  # a span with quotes: the text format could not carry it
    if "</response>" in response:
        spans["filler"].append("</response> inside")  # the template's own closing tag
    return spans
'''


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks/mine.md").write_text((ROOT / "tasks/commongen.md").read_text().replace("commongen", "mine"))
    tokenizer = train_bpe(RESPONSES * 20 + ["query"], vocab_size=300)
    tokenizer.save_pretrained(tmp_path / "tok")
    monkeypatch.chdir(tmp_path)

    def no_server(**kwargs):
        raise AssertionError("the rules backend must not start a server")

    monkeypatch.setattr(critique_step, "serve_in_background", no_server)
    return tmp_path, tokenizer


def run_critique(project, text=CRITIC):
    root, tokenizer = project
    (root / "tasks/mine.py").write_text(text)
    rollouts = [{"rollout_id": f"r{i}", "prompt_id": "p0", "query": "Use: stop", "response": response,
                 "response_ids": tokenizer(response).input_ids} for i, response in enumerate(RESPONSES)]
    scores = [{"rollout_id": f"r{i}", "env_reward": 0.0} for i in range(len(RESPONSES))]
    critic = CriticParams(backend="rules", model_dir="tasks/mine.py", model="drlc-rules", template="tasks/mine.md",
                          rewards={"concept": 0.5, "filler": -0.5}, cache_dir=str(root / "cache"))
    return critique(rollouts, scores, critic=critic, tokenizer_dir=str(root / "tok"), run_id="t", round_=1,
                    task="tasks/mine.py")


def test_spans_hold_any_character_and_come_from_the_row(project):
    rows, metrics = run_critique(project)
    assert [row["status"] for row in rows] == ["ok", "ok"]
    assert [(s["label"], s["text"]) for s in rows[0]["spans"]] == [("concept", '"stop"')]
    assert [(s["label"], s["text"]) for s in rows[1]["spans"]] == [("filler", "</response> inside")]
    start = RESPONSES[1].index("</response>")
    assert (rows[1]["spans"][0]["start"], rows[1]["spans"][0]["end"]) == (start, start + len("</response> inside"))
    assert {row["critic_model"] for row in rows} == {"drlc-rules"} and metrics["critic_requests"] == 0


def test_answers_are_cached_by_content_and_an_edit_misses(project):
    first, _ = run_critique(project)
    again, _ = run_critique(project)
    assert not any(row["cache_hit"] for row in first) and all(row["cache_hit"] for row in again)
    assert [row["spans"] for row in again] == [row["spans"] for row in first]
    assert [row["cache_key"] for row in again] == [row["cache_key"] for row in first]
    edited, _ = run_critique(project, CRITIC + "# edited\n")
    assert not any(row["cache_hit"] for row in edited)


def test_a_bug_in_critic_stops_in_one_line_naming_file_and_line(project):
    broken = CRITIC.replace('    spans = {"concept": [], "filler": []}', '    spans = {}["concept"]')
    with pytest.raises(CriticError) as error:
        run_critique(project, broken)
    message = str(error.value)
    assert "critic() of tasks/mine.py raised on response r0" in message and "mine.py line 5" in message
    assert "KeyError" in message and "\n" not in message


COLUMN_CRITIC = '''LABELS = ("concept", "filler")
def reward(prompts, completions):
    return [0.0] * len(completions)
def critic(response, concepts):
    return {"concept": [c for c in concepts if c in response], "filler": []}
'''


def run_with_columns(project, concepts, text=COLUMN_CRITIC):
    """One critique of RESPONSES[0], whose prompt p0 has the column `concepts`."""
    root, tokenizer = project
    (root / "tasks/mine.py").write_text(text)
    rollouts = [{"rollout_id": "r0", "prompt_id": "p0", "query": "Use: stop", "response": RESPONSES[0],
                 "response_ids": tokenizer(RESPONSES[0]).input_ids}]
    prompts = [{"prompt_id": "p0", "text": "Use: stop", "reference": "", "columns": json.dumps({"concepts": concepts})}]
    critic = CriticParams(backend="rules", model_dir="tasks/mine.py", model="drlc-rules", template="tasks/mine.md",
                          rewards={"concept": 0.5, "filler": -0.5}, cache_dir=str(root / "cache"))
    return critique(rollouts, [{"rollout_id": "r0", "env_reward": 0.0}], critic=critic, tokenizer_dir=str(root / "tok"),
                    run_id="t", round_=1, task="tasks/mine.py", prompt_rows=prompts)[0][0]


def test_critic_reads_the_prompts_columns_and_they_are_part_of_its_cache_key(project):
    said = run_with_columns(project, ["said", "left"])
    assert [(s["label"], s["text"]) for s in said["spans"]] == [("concept", "said"), ("concept", "left")]
    other = run_with_columns(project, ["stop"])  # same query and response, another column: not the cached answer
    assert not other["cache_hit"] and [s["text"] for s in other["spans"]] == ["stop"]
    assert run_with_columns(project, ["said", "left"])["cache_hit"]


def test_a_parameter_no_row_or_column_holds_is_named(project):
    with pytest.raises(CriticError, match=r"critic\(\) reads \['topic'\], which neither the scored rollout nor its "
                                          r"prompt's columns hold"):
        run_with_columns(project, ["x"], COLUMN_CRITIC.replace("response, concepts", "response, topic"))
