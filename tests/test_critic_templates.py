"""Tests for pipeline.critic.templates: the shipped prompts load and render; bad files fail by name."""

import dataclasses
import hashlib
from pathlib import Path

import pytest

from pipeline.core.errors import TemplateError
from pipeline.critic.offline.lexicon import ANSWER_LABELS
from pipeline.critic.templates import load_template

PROMPTS = Path(__file__).resolve().parent.parent / "prompts"
FIELDS = {
    "sentiment": {"response": " The film was not good {at all}."},
    "toxicity": {"response": "You are an idiot."},
    "summarization": {"document": "Rain closed two schools.", "summary": "Snow closed schools.", "score": "0.41"},
}

VALID = """---
task: sentiment
version: 3
placeholders: [response]
labels: [positive, negative]
---

## system

Judge it. Literal braces: {{like this}}.
Task: sentiment

### Output format

Positive: "<span>"

## user

<response>
{response}
</response>
"""


def write(tmp_path, text, name="t.md"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("task", sorted(FIELDS))
def test_shipped_template_loads_and_renders(task):
    path = PROMPTS / f"{task}.md"
    template = load_template(path)
    assert template.task == task
    assert template.labels == ANSWER_LABELS[task]
    assert set(template.placeholders) == set(FIELDS[task])
    assert template.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert f"\nTask: {task}\n" in template.system
    messages = template.render(FIELDS[task])
    assert [m["role"] for m in messages] == ["system", "user"]
    for name, value in FIELDS[task].items():
        tag = {"score": None}.get(name, name)
        if tag:
            assert f"<{tag}>\n{value}\n</{tag}>" in messages[1]["content"]
        else:
            assert value in messages[1]["content"]
    assert "{response}" not in messages[1]["content"] and "{{" not in messages[0]["content"]


def test_render_keeps_braces_in_values_and_unescapes_literals(tmp_path):
    template = load_template(write(tmp_path, VALID))
    system, user = template.render({"response": "a {b} }c{"})
    assert "Literal braces: {like this}." in system["content"]
    assert "<response>\na {b} }c{\n</response>" == user["content"]
    assert template.version == "3" and template.placeholders == ("response",)


def test_template_is_frozen(tmp_path):
    template = load_template(write(tmp_path, VALID))
    with pytest.raises(dataclasses.FrozenInstanceError):
        template.task = "toxicity"


@pytest.mark.parametrize("fields, words", [
    ({}, ["missing", "response"]),
    ({"response": "x", "prompt": "y"}, ["extra", "prompt"]),
    ({"response": 3}, ["response", "not strings"]),
])
def test_render_rejects_bad_fields(tmp_path, fields, words):
    template = load_template(write(tmp_path, VALID))
    with pytest.raises(TemplateError) as error:
        template.render(fields)
    for word in words:
        assert word in str(error.value)


@pytest.mark.parametrize("old, new, words", [
    ("---\ntask", "task", ["no front matter"]),
    ("labels: [positive, negative]\n---", "labels: [positive, negative]", ["not closed"]),
    ("version: 3\n", "", ["missing", "version"]),
    ("version: 3\n", "version: 3\nauthor: me\n", ["unknown keys", "author"]),
    ("placeholders: [response]", "placeholders: [response, prompt]", ["prompt", "never appear"]),
    ("{response}", "{response} {prompt}", ["undeclared", "prompt"]),
    ("{{like this}}", "{like this}", ["like this"]),
    ("{{like this}}", "}", ["brace"]),
    ("{response}", "{response:>5}", ["{response:>5}"]),
    ("### Output format", "### Format", ["Output format"]),
    ("## user", "## usr", ["unknown section", "usr"]),
    ("Task: sentiment", "Task: toxicity", ["Task: sentiment"]),
    ("placeholders: [response]", "placeholders: response", ["placeholders", "list"]),
])
def test_bad_template_names_file_and_problem(tmp_path, old, new, words):
    assert old in VALID
    path = write(tmp_path, VALID.replace(old, new, 1), name="broken.md")
    with pytest.raises(TemplateError) as error:
        load_template(path)
    message = str(error.value)
    assert "broken.md" in message
    for word in words:
        assert word in message


def test_missing_file_is_a_template_error(tmp_path):
    with pytest.raises(TemplateError, match="nope.md"):
        load_template(tmp_path / "nope.md")
