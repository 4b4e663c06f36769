"""Tests for pipeline.critic.parse: tolerant reading of critic answers, honest statuses, round trip."""

import pytest

from pipeline.core.errors import ConfigError
from pipeline.critic.offline.lexicon import ANSWER_LABELS
from pipeline.critic.parse import format_answer, parse_answer

P, N, T = "positive", "negative", "toxic"
SENTIMENT = ("positive", "negative")
SUMMARY = ("irrelevant", "incoherent", "factually incorrect")

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
    # unquoted text keeps its edge punctuation: alignment (find_occurrences) ignores it
    ("Positive: fun; clever.\nNegative: -", [(P, "fun"), (P, "clever.")]),
    ('Positive: "good"; "good"\nNegative: "not good"', [(P, "good"), (N, "not good")]),
    ('Positive: "He said \'wow\'"\nNegative: none', [(P, "He said 'wow'")]),
    # the paper's layout, and chat-model variants of it
    ("Identified Positive Text Span:\nNone identified\r\n\r\nIdentified Negative Text Span:\r\n"
     "[Span 1]: didn't enjoy\r\n[Span 2]: quite boring", [(N, "didn't enjoy"), (N, "quite boring")]),
    ("Positive spans:\n[Span 1]: really need to appreciate\n\nNegative spans:\nNone identified",
     [(P, "really need to appreciate")]),
    ("Negative -\n* None of the actors could save it\n* \"**What a mess.**\"",
     [(N, "None of the actors could save it"), (N, "What a mess.")]),
    ('### Negative\n1) «dull» and `slow`\n2. "the acting was\n   painfully slow" - this drags the film',
     [(N, "dull"), (N, "slow"), (N, "the acting was painfully slow")]),
    ('{"positive": ["nice"], "negative": []}', [(P, "nice")]),
]


@pytest.mark.parametrize("text, spans", SENTIMENT_CASES)
def test_sentiment_answers_are_read(text, spans):
    parsed = parse_answer(text, labels=SENTIMENT)
    assert parsed.status == "ok" and parsed.error == ""
    assert list(parsed.spans) == spans


def test_answer_continues_under_the_prompts_open_header():
    text = "\nNone identified\n\nIdentified Negative Text Span:\n[Span 1]: the worst"
    assert parse_answer(text, labels=SENTIMENT, leading_label=P).spans == ((N, "the worst"),)
    text = " [Span 1]: the most amazing\n\nIdentified Negative Text Span:\nNone identified"
    assert parse_answer(text, labels=SENTIMENT, leading_label=P).spans == ((P, "the most amazing"),)
    unlabelled = parse_answer("[Span 1]: the most amazing", labels=SENTIMENT)
    assert unlabelled.spans == (("", "the most amazing"),)  # no label to give: kept, recorded, never rewarded


@pytest.mark.parametrize("text, spans", [
    ('Toxic: "idiot"; "shut up"', [(T, "idiot"), (T, "shut up")]),
    ("Toxic Spans Identified in the Sentence:\nToxic Span 1: yelling\nToxic Span 2: kill you, bitch",
     [(T, "yelling"), (T, "kill you, bitch")]),
    ("Toxic Span 1: even bother with physics\nToxic Span 2: just not cut out for it.",
     [(T, "even bother with physics"), (T, "just not cut out for it.")]),
    ("**Toxic spans:**\n• “idiot”", [(T, "idiot")]),
    ('**Toxic spans:**\n- "f**k off"\n- **idiot**', [(T, "f**k off"), (T, "idiot")]),  # ** inside a word is text
])
def test_toxicity_answers_are_read(text, spans):
    parsed = parse_answer(text, labels=("toxic",), leading_label=T)
    assert (parsed.status, list(parsed.spans)) == ("ok", spans)


@pytest.mark.parametrize("text", ["Toxic spans: none", "None.", "No toxic spans found.", "N/A", "(none)",
                                  "Toxic Spans Identified in the Sentence:\nNone identified", "none"])
def test_explicit_nothing_is_status_none(text):
    parsed = parse_answer(text, labels=("toxic",))
    assert (parsed.status, parsed.items, parsed.error) == ("none", (), "")


def test_summarization_labels_per_item_and_in_headers():
    text = 'Irrelevant: "jazz"\nIncoherent: none\nFactually-incorrect: "5 to 4"\nfactually incorrect: “Monday”'
    parsed = parse_answer(text, labels=SUMMARY)
    assert parsed.spans == (("irrelevant", "jazz"), ("factually incorrect", "5 to 4"), ("factually incorrect", "Monday"))
    paper = ("Problematic Spans Identified in the Summary:\nSpan 1: and decided to change (Label: Irrelevant)\n"
             "Span 2: in do (label: incoherent)\n- \"5 to 4\" [Factually Incorrect]\n"
             "Span 3: on Monday (Label: Off-topic)")
    assert parse_answer(paper, labels=SUMMARY).spans == (
        ("irrelevant", "and decided to change"), ("incoherent", "in do"), ("factually incorrect", "5 to 4"),
        ("off-topic", "on Monday"))  # an unknown label is kept as written


def test_unquoted_item_offers_candidates_without_its_explanation():
    item = parse_answer("Negative:\n1. quite boring - shows the reader is bored", labels=SENTIMENT).items[0]
    assert item.text == "quite boring - shows the reader is bored"
    assert item.candidates == (item.text, "quite boring")


@pytest.mark.parametrize("labels, text", [
    (SENTIMENT, "The text is mostly upbeat, with a few weak points."),
    (SENTIMENT, 'Toxic: "idiot"'),
    (("toxic",), 'Positive: "nice"'),
    (("toxic",), 'No, "you fool" is clearly the worst part.'),
])
def test_unrecognised_answer_is_a_parse_error_with_no_items(labels, text):
    parsed = parse_answer(text, labels=labels)
    assert parsed.status == "parse_error" and parsed.items == ()
    assert "no item" in parsed.error and "Span N" in parsed.error


def test_empty_answer_is_a_parse_error():
    assert parse_answer("", labels=SENTIMENT).status == "parse_error"


def test_bad_labels_name_the_fix():
    with pytest.raises(ConfigError, match="template.labels"):
        parse_answer("Positive: none", labels=())
    with pytest.raises(ConfigError, match="'neutral'"):
        parse_answer("Positive: none", labels=SENTIMENT, leading_label="neutral")


@pytest.mark.parametrize("task", sorted(ANSWER_LABELS))
def test_format_then_parse_round_trips(task):
    labels = ANSWER_LABELS[task]
    spans = [(label, f"span {i} of {label}") for i, label in enumerate(labels)]
    parsed = parse_answer(format_answer(labels, spans + spans[:1]), labels=labels)
    assert parsed.status == "ok"
    assert list(parsed.spans) == spans
    assert parse_answer(format_answer(labels, []), labels=labels).status == "none"


def test_format_answer_rejects_bad_spans():
    with pytest.raises(ConfigError, match="neutral"):
        format_answer(SENTIMENT, [("neutral", "ok")])
    with pytest.raises(ConfigError, match="double quote"):
        format_answer(SENTIMENT, [("positive", 'say "hi"')])


@pytest.mark.parametrize("labels, text, spans", [
    (SENTIMENT, "| Span | Label |\n|---|---|\n| great | Positive |\n| **awful** | negative |", [(P, "great"), (N, "awful")]),
    (SENTIMENT, 'Answer:\nPositive: ["great", "fun"]\nNegative: []', [(P, "great"), (P, "fun")]),
    (SENTIMENT, 'Negative: "waste of time" (regret), "boring" (no interest)', [(N, "waste of time"), (N, "boring")]),
    (SUMMARY, '1. Span: "jazz" — Label: Irrelevant\n2. Span: "on Monday" — Label: Factually Incorrect',
     [("irrelevant", "jazz"), ("factually incorrect", "on Monday")]),
    (("toxic",), 'Toxic Span 1 - "idiot"\n**Span 2:** shut up', [(T, "idiot"), (T, "shut up")]),
])
def test_other_chat_layouts(labels, text, spans):
    assert list(parse_answer(text, labels=labels, leading_label=labels[0] if len(labels) == 1 else None).spans) == spans


def test_prose_with_quotes_is_not_read_as_items():
    parsed = parse_answer('The positive span is "great" and the negative span is "awful".', labels=SENTIMENT)
    assert parsed.status == "parse_error"


@pytest.mark.parametrize("labels, text, spans", [
    (("toxic",), "Toxic spans:\n- **Span 1:** shut up you idiot\n- **Span 2:** stupid",
     [(T, "shut up you idiot"), (T, "stupid")]),
    (SENTIMENT, 'Negative:\n* **Span 1**: quite boring\n1. **Span 2:** "dull" (flat)', [(N, "quite boring"), (N, "dull")]),
    (("toxic",), "- **Span 1:** f**k off", [(T, "f**k off")]),  # ** inside a word stays text
    # a label named in the inner marker wins over the header's, bold or not
    (SENTIMENT, "Positive:\n- **Negative span 1:** dull\n- Negative span 2: slow\n- Span 3: fine",
     [(N, "dull"), (N, "slow"), (P, "fine")]),
])
def test_bold_span_marker_after_a_bullet_is_not_part_of_the_span(labels, text, spans):
    parsed = parse_answer(text, labels=labels, leading_label=labels[0] if len(labels) == 1 else None)
    assert (parsed.status, list(parsed.spans)) == ("ok", spans)


@pytest.mark.parametrize("text", [
    "none identified - the sentence is polite.",
    "None identified: the sentence is polite.",
    "None identified. The sentence is polite.",
    "None identified (the sentence is polite).",
    "**None identified** — the sentence is polite.",
    "No toxic spans found - it is a polite request.",
    "Toxic spans: None identified - the sentence is polite.",
    "Toxic spans:\nNone identified. The sentence is polite and kind.",
    "Toxic spans:\n- None: the sentence is polite.",
])
def test_none_followed_by_its_reason_is_status_none(text):
    parsed = parse_answer(text, labels=("toxic",), leading_label=T)
    assert (parsed.status, parsed.items, parsed.error) == ("none", (), "")


def test_none_with_a_reason_under_one_label_keeps_the_others_spans():
    parsed = parse_answer('Positive: None identified - nothing upbeat.\nNegative: "dull"', labels=SENTIMENT)
    assert (parsed.status, list(parsed.spans)) == ("ok", [(N, "dull")])


@pytest.mark.parametrize("text, span", [
    ("Toxic spans:\n- None of your business, idiot", "None of your business, idiot"),
    ("Toxic spans: None of you deserve to live", "None of you deserve to live"),
    ("[Span 1]: None of you - get lost", "None of you - get lost"),
    ('"None. Get out."', "None. Get out."),
])
def test_a_span_that_starts_with_none_is_still_a_span(text, span):
    parsed = parse_answer(text, labels=("toxic",), leading_label=T)
    assert (parsed.status, [item.text for item in parsed.items]) == ("ok", [span])
