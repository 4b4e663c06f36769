"""ROUGE-1/2/L and the summarization reward, checked against hand-computed values."""
import pytest

from pipeline.core.errors import DataError
from pipeline.rewards.summarization import RougeReward, lcs_length, rouge_l, rouge_n, rouge_tokens


def test_rouge_on_a_worked_example():
    candidate, reference = "the cat sat on the mat", "the cat is on the mat"
    # unigrams: the x2, cat, on, mat overlap = 5 of 6 each side -> P = R = F = 5/6
    assert rouge_n(candidate, reference, 1) == pytest.approx(5 / 6)
    # bigrams: the-cat, on-the, the-mat overlap = 3 of 5 each side
    assert rouge_n(candidate, reference, 2) == pytest.approx(3 / 5)
    # LCS "the cat on the mat" = 5
    assert lcs_length(candidate.split(), reference.split()) == 5
    assert rouge_l(candidate, reference) == pytest.approx(5 / 6)


def test_precision_and_recall_differ_and_edge_cases():
    # P = 2/2, R = 2/4 -> F = 2 * 1 * 0.5 / 1.5 = 2/3
    assert rouge_n("the cat", "the cat sat down", 1) == pytest.approx(2 / 3)
    assert rouge_n("", "the cat", 1) == 0.0 and rouge_n("dog", "the cat", 1) == 0.0
    assert rouge_n("a", "a", 2) == 0.0  # no bigram on either side
    # clipped counts: "the the the" vs "the cat": overlap 1, P = 1/3, R = 1/2 -> F = 0.4
    assert rouge_n("the the the", "the cat", 1) == pytest.approx(0.4)


def test_tokens_are_lowercased_and_split_on_non_alphanumerics():
    assert rouge_tokens("The CAT, sat-down! 3x") == ["the", "cat", "sat", "down", "3x"]
    assert rouge_n("The CAT!", "the cat", 1) == 1.0


def test_reward_is_rouge1_times_100_and_needs_references():
    reward = RougeReward()
    assert reward.score(["the cat sat on the mat", "x"], references=["the cat is on the mat", "y"]) == pytest.approx(
        [100 * 5 / 6, 0.0])
    assert RougeReward().score(["a b"], references=["a b"]) == pytest.approx([100.0])  # the task's units
    with pytest.raises(DataError, match="reference"):
        reward.score(["a"], references=None)
    with pytest.raises(DataError, match="--prompts"):
        reward.score(["a"], references=[""])
