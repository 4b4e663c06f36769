"""The audit's scoring: SemEval character F1 and span precision/recall, checked by hand."""
import pytest

from pipeline.audit.labelled import LabelledPost
from pipeline.audit.span_baselines import everything, learn_wordlist, nothing, wordlist_spans
from pipeline.audit.span_metrics import char_f1, characters, offset_runs, score_post, span_precision_recall

TEXT = "you are a dumb idiot ok"  # dumb = 10..13, idiot = 15..19, ok = 21..22


def test_hand_computed_post():
    gold = offset_runs([10, 11, 12, 13, 15, 16, 17, 18, 19], "toxic")
    assert gold == [("toxic", 10, 14), ("toxic", 15, 20)]
    predicted = [("toxic", 15, 23)]  # "idiot ok": 8 characters, 5 of them gold
    score = score_post(predicted, gold)
    assert score.char_f1 == pytest.approx(2 * 5 / (8 + 9))  # 10/17
    # IoU("idiot ok", "idiot") = 5/8 >= 0.5: the prediction matches one of the two gold spans
    assert (score.n_pred_spans, score.n_gold_spans, score.matched_pred, score.matched_gold) == (1, 2, 1, 1)
    assert score_post(predicted, gold, iou=0.7).matched_pred == 0  # 5/8 < 0.7


@pytest.mark.parametrize("predicted, gold, expected", [
    (set(), set(), 1.0),  # no gold and no prediction: the post scores 1
    ({("toxic", 3)}, set(), 0.0),  # one side empty: 0
    (set(), {("toxic", 3)}, 0.0),
    ({("toxic", 1), ("toxic", 2)}, {("toxic", 2), ("toxic", 3)}, 0.5),
])
def test_char_f1_edge_cases(predicted, gold, expected):
    assert char_f1(predicted, gold) == expected


def test_a_character_counts_only_with_its_label():
    gold = [("negative", 0, 4)]
    assert score_post([("positive", 0, 4)], gold).char_f1 == 0.0
    assert score_post([("positive", 0, 4)], gold).matched_pred == 0
    assert score_post([("negative", 0, 4), ("positive", 0, 4)], gold).char_f1 == pytest.approx(2 * 4 / (8 + 4))


def test_span_precision_recall_are_micro_over_posts():
    gold = offset_runs([10, 11, 12, 13, 15, 16, 17, 18, 19], "toxic")
    scores = [score_post([("toxic", 15, 23)], gold), score_post([("toxic", 0, 3)], []), score_post([], [])]
    result = span_precision_recall(scores)
    assert result["span_precision"] == pytest.approx(1 / 2)  # 1 of 2 predicted spans matches
    assert result["span_recall"] == pytest.approx(1 / 2)  # 1 of 2 gold spans is matched
    assert result["span_f1"] == pytest.approx(0.5)
    assert span_precision_recall([score_post([], [])]) == {"span_precision": None, "span_recall": None,
                                                           "span_f1": None}


def test_baselines():
    post = LabelledPost(line=1, post_id="1", text=TEXT, spans=(("toxic", 15, 20),))
    assert everything(post, ("toxic",)) == [("toxic", 0, len(TEXT))]
    assert nothing(post, ("toxic",)) == []
    other = LabelledPost(line=2, post_id="2", text="an idiot, a nice idiot", spans=(("toxic", 3, 8),))
    words = learn_wordlist([post, other], min_count=3)
    # idiot: 3 occurrences, 2 labelled (> half); dumb: 1 occurrence (< min_count)
    assert words == {"idiot": "toxic"}
    assert wordlist_spans(post, words) == [("toxic", 15, 20)]
    assert characters(wordlist_spans(other, words)) == characters([("toxic", 3, 8), ("toxic", 17, 22)])
    assert learn_wordlist([post, other], min_count=4) == {}
