"""read_answer: parse + keep, the status and reasons a round records, on layouts not in the benchmark set."""
import pytest

from pipeline.critic.annotate import read_answer

S, T, SU = ("positive", "negative"), ("toxic",), ("irrelevant", "incoherent", "factually incorrect")
FILM = "The film was dull but the score was lovely."
BOTH = [("positive", "lovely"), ("negative", "dull")]


@pytest.mark.parametrize("answer", [
    "Positive:\n    - lovely\nNegative:\n    - dull",
    '1. Positive span: "lovely"\n2. Negative span: "dull"',
    'positive → "lovely"\nnegative → "dull"',
    'Sentiment spans:\n- "lovely" (positive)\n- "dull" (negative)',
    "- lovely: positive\n- dull: negative",
    "<answer>\nPositive: lovely\nNegative: dull\n</answer>",
])
def test_label_after_the_span_or_arrows_or_indented_bullets(answer):
    read = read_answer(answer, labels=S, leading_label=None, response=FILM, rewards={"positive": 1, "negative": -1})
    assert (read.status, sorted(read.kept), read.dropped) == ("ok", sorted(BOTH), [])


def test_label_between_span_and_explanation_is_not_a_header():
    read = read_answer("Problematic Spans:\n1. **a pool** — *Factually incorrect*: the document says library",
                       labels=SU, leading_label=None, response="The council built a pool.",
                       rewards=dict.fromkeys(SU, -1.0))
    assert (read.status, read.kept) == ("ok", [("factually incorrect", "a pool")])


def test_no_match_and_document_reason():
    read = read_answer("Span 1: a library (Label: Factually Incorrect)", labels=SU, leading_label=None,
                       response="The council built a pool.", rewards=dict.fromkeys(SU, -1.0),
                       elsewhere={"document": "The council will build a library."})
    assert read.status == "no_match" and read.kept == []
    assert read.dropped == [{"label": "factually incorrect", "text": "a library",
                             "reason": "not in the response (found only in the document)"}]
    assert "a library" in read.error


def test_unknown_label_only_is_no_match_not_ok():
    read = read_answer("Span 1: pool (Label: Off-topic)", labels=SU, leading_label=None,
                       response="The council built a pool.", rewards=dict.fromkeys(SU, -1.0))
    assert read.status == "no_match" and read.items == [{"label": "off-topic", "text": "pool"}]
    assert read.dropped[0]["reason"] == "label 'off-topic' has no reward"
