"""Tests for pipeline.critic.offline.lexicon: rendered prompt -> answer -> parse -> align, for every template."""

from pathlib import Path

import pytest
from test_critic_align import build_tokenizer

from pipeline.core.errors import CriticError
from pipeline.critic.align import align_spans
from pipeline.critic.offline.lexicon import ANSWER_LABELS, answer
from pipeline.critic.parse import parse_answer
from pipeline.critic.templates import load_template

PROMPTS = Path(__file__).resolve().parent.parent / "prompts"
SENTIMENT_REWARDS = {"positive": 1.0, "negative": -1.0}


def critique(task, fields):
    template = load_template(PROMPTS / f"{task}.md")
    return parse_answer(answer(template.render(fields)), labels=template.labels)


def words_by_sign(text, spans, rewards):
    """Align, then read back which whole words got a positive or a negative reward."""
    tokenizer = build_tokenizer()
    ids = tokenizer.encode(text, add_special_tokens=False)
    result = align_spans(response_text=text, response_ids=ids, tokenizer=tokenizer, spans=spans, rewards=rewards)
    pieces = [tokenizer.decode([i]) for i in ids]
    positive = "".join(p if r > 0 else "|" for p, r in zip(pieces, result.intrinsic_rewards)).replace("|", " ").split()
    negative = "".join(p if r < 0 else "|" for p, r in zip(pieces, result.intrinsic_rewards)).replace("|", " ").split()
    return positive, negative


@pytest.mark.parametrize("text, positive, negative", [
    (" The movie was not good, but the cast was very charming.", ["very", "charming"], ["not", "good"]),
    ("I loved this story and the acting was wonderful", ["loved", "wonderful"], []),
    ("A dull plot and really awful acting", [], ["dull", "really", "awful"]),
    ("It is not bad at all, never boring", ["not", "bad", "never", "boring"], []),
    ("The train leaves at nine", [], []),
])
def test_sentiment_round_trip_rewards_the_right_words(text, positive, negative):
    parsed = critique("sentiment", {"response": text})
    assert parsed.status == ("ok" if positive or negative else "none")  # "none": the answer says nothing
    got_positive, got_negative = words_by_sign(text, parsed.spans, SENTIMENT_REWARDS)
    assert got_positive == positive
    assert got_negative == negative


def test_sentiment_spans_keep_modifiers_together():
    parsed = critique("sentiment", {"response": "I don't like it; it isn't a great film, no problem though."})
    assert parsed.spans == (("positive", "no problem"), ("negative", "don't like"), ("negative", "isn't a great"))


def test_toxicity_round_trip():
    text = "Shut up, you stupid idiot. The weather is nice."
    parsed = critique("toxicity", {"response": text})
    assert parsed.spans == (("toxic", "Shut up"), ("toxic", "stupid"), ("toxic", "idiot"))
    _, negative = words_by_sign(text, parsed.spans, {"toxic": -1.0})
    assert negative == ["Shut", "up", "stupid", "idiot"]
    assert critique("toxicity", {"response": "A calm and friendly reply."}).spans == ()


def test_summarization_round_trip_marks_unsupported_words():
    fields = {"document": "The council voted to build a library on Elm Street.",
              "summary": "The council voted for a jazz festival on Elm Street.", "score": "0.30"}
    parsed = critique("summarization", fields)
    assert parsed.spans == (("irrelevant", "jazz festival"),)
    rewards = {label: -1.0 for label in ANSWER_LABELS["summarization"]}
    _, negative = words_by_sign(fields["summary"], parsed.spans, rewards)
    assert negative == ["jazz", "festival"]


@pytest.mark.parametrize("task", sorted(ANSWER_LABELS))
def test_every_template_answer_parses_with_all_labels(task):
    template = load_template(PROMPTS / f"{task}.md")
    fields = {name: "A plain sentence." for name in template.placeholders}
    text = answer(template.render(fields))
    assert [line.split(":")[0].lower() for line in text.splitlines()] == list(template.labels)
    assert parse_answer(text, labels=template.labels).status in ("ok", "none")


def test_delimited_text_is_read_verbatim_even_with_tag_like_content():
    text = " good <response> inner </response> bad"
    parsed = critique("sentiment", {"response": text})
    assert parsed.spans == (("positive", "good"), ("negative", "bad"))


@pytest.mark.parametrize("messages, words", [
    ([{"role": "user", "content": "<response>\ngood\n</response>"}], ["Task:"]),
    ([{"role": "system", "content": "Task: poetry"}, {"role": "user", "content": "x"}], ["poetry"]),
    ([{"role": "system", "content": "Task: sentiment"}, {"role": "user", "content": "good"}], ["<response>"]),
    ([{"role": "system", "content": "Task: sentiment"}], ["user message"]),
    ([{"role": "system", "content": "Task: summarization"},
      {"role": "user", "content": "<summary>\nx\n</summary>"}], ["<document>"]),
])
def test_malformed_messages_raise_critic_error(messages, words):
    with pytest.raises(CriticError) as error:
        answer(messages)
    for word in words:
        assert word in str(error.value)
