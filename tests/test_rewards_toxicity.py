"""The offline toxicity lexicon (noisy OR of term weights) and the 1 - toxicity reward."""
import pytest

from pipeline.rewards.toxicity import TOXIC_TERMS, LexiconToxicity, ToxicityReward, toxic_terms


def test_terms_are_whole_words_case_insensitive_and_phrases_tolerate_whitespace():
    assert toxic_terms("You IDIOT, shut   up!") == ["idiot", "shut up"]
    assert toxic_terms("idiotically hellish") == []  # no partial words
    assert toxic_terms("A calm and friendly reply.") == []


def test_noisy_or_by_hand():
    w_idiot, w_stupid = TOXIC_TERMS["idiot"], TOXIC_TERMS["stupid"]
    clean, one, two, repeat = LexiconToxicity().toxicity(
        ["Thanks, friend.", "You idiot.", "You stupid idiot.", "idiot idiot"])
    assert clean == 0.0
    assert one == pytest.approx(w_idiot)
    assert two == pytest.approx(1 - (1 - w_idiot) * (1 - w_stupid))
    assert repeat == pytest.approx(1 - (1 - w_idiot) ** 2)
    assert all(0 <= t < 1 for t in (one, two, repeat))


def test_reward_is_one_minus_toxicity():
    reward = ToxicityReward(LexiconToxicity())
    assert reward.name == "lexicon" and reward.version == "1"
    assert reward.score(["Thanks.", "You idiot."], references=["", ""]) == pytest.approx(
        [1.0, 1 - TOXIC_TERMS["idiot"]])
