"""Plain-text critic prompts: the RELC paper's three .txt files load, render, go through a real
loopback server that answers in the paper's layout, and their answers are parsed and aligned.

The prompt files are read from ../shared/data/critic_prompts at test time (never copied here).
"""

import hashlib
import re
import tempfile
from pathlib import Path

import pytest
from conftest import train_bpe

from pipeline.core.cache import CriticCache
from pipeline.core.errors import TemplateError
from pipeline.critic.annotate import annotate_round
from pipeline.critic.client import CriticClient
from pipeline.critic.offline.server import serve_in_background
from pipeline.critic.templates import load_template
from pipeline.tasks import get_task

PAPER = Path(__file__).resolve().parents[2] / "shared" / "data" / "critic_prompts"
if not PAPER.is_dir():
    PAPER = Path("/work/shared/data/critic_prompts")
pytestmark = pytest.mark.skipif(not PAPER.is_dir(), reason="the paper's prompts are not in ../shared/data")

SENTIMENT_FIELDS = get_task("sentiment").critic_fields
SENTIMENT, TOXICITY, SUMMARY = ("positive", "negative"), ("toxic",), ("irrelevant", "incoherent", "factually incorrect")
CASES = {
    "sentiment": ("prompt_sentiment_3shot_v2.txt", SENTIMENT),
    "toxicity": ("prompt_toxicity_3shot_v2.txt", TOXICITY),
    "summarization": ("prompt_summ_3shot_rouge_v2.txt", SUMMARY),
}


def paper(task):
    name, labels = CASES[task]
    return load_template(PAPER / name, task=task, labels=labels, fields=get_task(task).critic_fields)


@pytest.mark.parametrize("task, leading, placeholders", [
    ("sentiment", "positive", ("response",)), ("toxicity", "toxic", ("response",)),
    ("summarization", None, ("document", "summary", "score")),
])
def test_paper_prompts_load_with_their_open_header_label(task, leading, placeholders):
    template = paper(task)
    assert (template.task, template.placeholders, template.leading_label) == (task, placeholders, leading)
    assert template.sha256 == hashlib.sha256((PAPER / CASES[task][0]).read_bytes()).hexdigest()
    fields = {name: f"<<{name}>>" for name in placeholders}
    messages = template.render(fields)
    assert [m["role"] for m in messages] == ["user"]
    text = messages[0]["content"]
    positions = [text.index(f"<<{name}>>") for name in placeholders]
    assert positions == sorted(positions) and "{}" not in text  # filled in the task's field order


def test_plain_text_prompt_needs_labels_and_the_right_placeholder_count(tmp_path):
    with pytest.raises(TemplateError, match="critic.labels"):
        load_template(PAPER / CASES["sentiment"][0], task="sentiment", labels=(), fields=SENTIMENT_FIELDS)
    two = tmp_path / "two.txt"
    two.write_text("Text: {}\nAgain: {}\nPositive:")
    with pytest.raises(TemplateError, match=r"2 '\{\}' placeholder\(s\), but task 'sentiment' fills 1 \(response"):
        load_template(two, task="sentiment", labels=SENTIMENT, fields=SENTIMENT_FIELDS)
    named = tmp_path / "named.txt"
    named.write_text("Text: {response}")
    with pytest.raises(TemplateError, match="positional"):
        load_template(named, task="sentiment", labels=SENTIMENT, fields=SENTIMENT_FIELDS)


def test_a_plain_text_prompt_without_the_task_fields_is_refused():
    with pytest.raises(TemplateError, match="critic fields"):
        load_template(PAPER / CASES["sentiment"][0], task="sentiment", labels=SENTIMENT)


def test_markdown_template_labels_must_match_critic_labels():
    shipped = Path(__file__).resolve().parents[1] / "prompts" / "sentiment.md"
    assert load_template(shipped, labels=SENTIMENT).labels == SENTIMENT
    with pytest.raises(TemplateError, match=r"critic.labels: \[\]"):
        load_template(shipped, labels=("good", "bad"))


# An LLM stand-in that answers the way the paper's few-shot examples do: it continues under
# the prompt's open header (sentiment, toxicity) and marks words from a small lexicon.
LEXICON = {"awful": "negative", "boring": "negative", "wonderful": "positive", "idiot": "toxic",
           "stupid": "toxic", "jazz festival": "irrelevant"}


def paper_layout_answer(messages):
    prompt = messages[-1]["content"]
    if prompt.rstrip().endswith("Problematic Spans Identified in the Summary:"):
        summary = re.findall(r"Summary to be Labeled:\n(.*?)\n\nSummary Score:", prompt, re.S)[-1]
        found = [w for w in LEXICON if w in summary]
        return "\n" + "\n".join(f"Span {i}: {w} (Label: Irrelevant)" for i, w in enumerate(found, 1)) if found \
            else "None identified"
    sentence = re.findall(r"Sentence to be Labeled:\n(.*?)\n\n", prompt, re.S)[-1]
    if prompt.rstrip().endswith("Toxic Spans Identified in the Sentence:"):
        found = [w for w in LEXICON if LEXICON[w] == "toxic" and w in sentence]
        return "\n" + ("\n".join(f"Toxic Span {i}: {w}" for i, w in enumerate(found, 1)) or "None identified")
    blocks = []
    for label in ("positive", "negative"):
        found = [w for w in LEXICON if LEXICON[w] == label and w in sentence]
        blocks.append("\n".join(f"[Span {i}]: {w}" for i, w in enumerate(found, 1)) or "None identified")
    return f"\n{blocks[0]}\n\nIdentified Negative Text Span:\n{blocks[1]}"


@pytest.mark.parametrize("task, response, expected", [
    ("sentiment", "The plot was awful and boring, the music wonderful.",
     {("negative", "awful"), ("negative", "boring"), ("positive", "wonderful")}),
    ("toxicity", "Shut up, you stupid idiot.", {("toxic", "stupid"), ("toxic", "idiot")}),
    ("summarization", "The council voted for a jazz festival.", {("irrelevant", "jazz festival")}),
])
def test_paper_prompt_round_trip_through_a_real_server(task, response, expected):
    template = paper(task)
    tokenizer = train_bpe([response] * 5 + ["The council voted to build a library on Elm Street."] * 5)
    row = {"rollout_id": "r0", "response": response, "response_ids": tokenizer.encode(response),
           "env_reward": -1.0, "query": "The council voted to build a library on Elm Street.\nTL;DR:"}
    none_row = dict(row, rollout_id="r1", response="A plain day.", response_ids=tokenizer.encode("A plain day."))
    rewards = {label: -1.0 for label in template.labels}
    with tempfile.TemporaryDirectory() as tmp, CriticCache(tmp) as cache, \
            serve_in_background(backend=paper_layout_answer) as (url, stats):
        client = CriticClient(base_url=url, model="paper-layout", timeout_s=5.0)
        out = annotate_round([row, none_row], template=template, fields=get_task(task).critic_fields,
                             tokenizer=tokenizer, client=client, cache=cache,
                             threshold=0.0, rewards=rewards, alignment="exact", progress=False)
        assert stats()["requests"] == 2
    assert out[0]["status"] == "ok" and out[0]["template_sha"] == template.sha256
    assert {(s["label"], s["text"]) for s in out[0]["spans"]} == expected
    assert all(response[s["start"]:s["end"]] == s["text"] for s in out[0]["spans"])
    assert out[0]["dropped"] == [] and any(r < 0 for r in out[0]["token_rewards"])
    assert out[1]["status"] == "none" and out[1]["spans"] == [] and set(out[1]["token_rewards"]) == {0.0}
