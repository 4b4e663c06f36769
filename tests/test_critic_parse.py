"""Tests for pipeline.critic.parse: tolerant reading of critic answers, strict failure, round trip."""

import pytest

from pipeline.critic.parse import TASK_LABELS, format_answer, parse_answer
from pipeline.errors import ConfigError

P, N = "positive", "negative"

SENTIMENT_CASES = [
    ('Positive: "lovely"; "very kind"\nNegative: none', [(P, "lovely"), (P, "very kind")]),
    ("positive: 'great'\nNEGATIVE: 'dull', 'slow'", [(P, "great"), (N, "dull"), (N, "slow")]),
    ("**Positive:** “great”, “fun”\n**Negative spans:** None identified.", [(P, "great"), (P, "fun")]),
    ("1. Positive: 'don't stop' (keeps the tone up)\n2. Negative: N/A", [(P, "don't stop")]),
    ("- Positive: ‘warm’\n- Negative: no negative spans", [(P, "warm")]),
    ('Positive:\n- "a fine cast"\n* "witty"\n\nNegative:\n"bad"\n\nNote: "x" is neutral.',
     [(P, "a fine cast"), (P, "witty"), (N, "bad")]),
    ("Positive:\n- a fine cast\n- None\nNegative: nothing", [(P, "a fine cast")]),
    ('Sure! Here is my analysis.\nPositive: "good", Negative: "bad"', [(P, "good"), (N, "bad")]),
    ("Positive: fun; clever.\nNegative: -", [(P, "fun"), (P, "clever")]),
    ('Positive: "good"; "good"\nNegative: "not good"', [(P, "good"), (N, "not good")]),
    ('Positive: "He said \'wow\'"\nNegative: none', [(P, "He said 'wow'")]),
    ("Positive: none\nNegative: none", []),
]


@pytest.mark.parametrize("text, spans", SENTIMENT_CASES)
def test_sentiment_answers_are_read(text, spans):
    parsed = parse_answer("sentiment", text)
    assert parsed.status == "ok" and parsed.error == ""
    assert list(parsed.spans) == spans


@pytest.mark.parametrize("text, spans", [
    ('Toxic: "idiot"; "shut up"', [("toxic", "idiot"), ("toxic", "shut up")]),
    ("Toxic spans: none", []),
    ("None.", []),
    ("No toxic spans found.", []),
    ("N/A", []),
])
def test_toxicity_answers_are_read(text, spans):
    parsed = parse_answer("toxicity", text)
    assert (parsed.status, list(parsed.spans)) == ("ok", spans)


def test_summarization_labels_with_two_words():
    text = 'Irrelevant: "jazz"\nIncoherent: none\nFactually-incorrect: "5 to 4"\nfactually incorrect: “Monday”'
    parsed = parse_answer("summarization", text)
    assert parsed.spans == (("irrelevant", "jazz"), ("factually incorrect", "5 to 4"), ("factually incorrect", "Monday"))


@pytest.mark.parametrize("task, text", [
    ("sentiment", "The text is mostly upbeat, with a few weak points."),
    ("sentiment", ""),
    ("sentiment", 'Toxic: "idiot"'),
    ("toxicity", 'Positive: "nice"'),
    ("toxicity", 'No, "you fool" is clearly the worst part.'),
])
def test_unrecognised_answer_is_a_parse_error_with_no_spans(task, text):
    parsed = parse_answer(task, text)
    assert parsed.status == "parse_error"
    assert parsed.spans == ()
    assert ":" in parsed.error and "line" in parsed.error


def test_unknown_task_lists_valid_tasks():
    with pytest.raises(ConfigError) as error:
        parse_answer("translation", "Positive: none")
    assert "translation" in str(error.value) and "sentiment" in str(error.value)


@pytest.mark.parametrize("task", sorted(TASK_LABELS))
def test_format_then_parse_round_trips(task):
    spans = [(label, f"span {i} of {label}") for i, label in enumerate(TASK_LABELS[task])]
    text = format_answer(task, spans + spans[:1])
    parsed = parse_answer(task, text)
    assert parsed.status == "ok"
    assert list(parsed.spans) == spans
    assert parse_answer(task, format_answer(task, [])).spans == ()


def test_format_answer_rejects_bad_spans():
    with pytest.raises(ConfigError, match="neutral"):
        format_answer("sentiment", [("neutral", "ok")])
    with pytest.raises(ConfigError, match="double quote"):
        format_answer("sentiment", [("positive", 'say "hi"')])
