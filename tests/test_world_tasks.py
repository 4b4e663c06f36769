"""The comment (toxicity) and news (summarization) worlds: seeded, mixed, and matched to their rewards."""
import random
import re

import pytest

from pipeline.core.errors import ConfigError
from pipeline.data import summarization_world as news
from pipeline.data import toxicity_world as comments
from pipeline.rewards.summarization import rouge_n
from pipeline.rewards.toxicity import LexiconToxicity, toxic_terms


def test_generators_are_deterministic_prefix_stable_and_leave_the_global_rng_alone():
    random.seed(5)
    state = random.getstate()
    assert comments.generate_comments(40, seed=1) == comments.generate_comments(40, seed=1)
    assert comments.generate_comments(60, seed=1)[:40] == comments.generate_comments(40, seed=1)
    assert comments.generate_comments(40, seed=1) != comments.generate_comments(40, seed=2)
    assert news.generate_documents(60, seed=1)[:40] == news.generate_documents(40, seed=1)
    assert news.summarization_prompts(20, seed=3) == news.summarization_prompts(20, seed=3)
    assert comments.comment_prefixes(20, seed=3) == comments.comment_prefixes(20, seed=3)
    assert random.getstate() == state


def test_comment_world_mixes_toxic_and_civil_and_every_toxic_word_is_in_the_lexicon():
    texts = comments.generate_comments(2000, seed=0)
    toxicity = LexiconToxicity().toxicity(texts)
    toxic_share = sum(t >= 0.5 for t in toxicity) / len(texts)
    assert 0.25 < toxic_share < 0.45, toxic_share  # TOXIC_SHARE 0.4, some toxic comments hold civil sentences only
    assert sum(t == 0.0 for t in toxicity) / len(texts) > 0.5
    assert len({round(t, 3) for t in toxicity}) > 10  # rewards vary, not just 0/1
    for group in comments.TOXIC_WORDS.values():
        for phrase in group:
            assert toxic_terms(phrase), phrase
    for group in comments.CIVIL_WORDS.values():
        for word in group:
            assert not toxic_terms(word), word


def test_comment_prefixes_are_civil_openings_shared_by_both_tones():
    prefixes = comments.comment_prefixes(500, seed=0, min_words=2, max_words=4)
    assert all(not toxic_terms(p) for p in prefixes)
    assert all(1 <= len(p.split()) <= 4 for p in prefixes)
    assert len(set(prefixes)) > 30
    with pytest.raises(ConfigError, match="min_words"):
        comments.comment_prefixes(3, seed=0, min_words=3, max_words=2)


def test_news_world_documents_support_the_reference_and_corpus_summaries_vary():
    prompts = news.summarization_prompts(200, seed=0)
    headlines = {headline for headline, _, _ in news.EVENTS.values()}
    for p in prompts:
        assert p["text"].endswith(" TL;DR:")
        assert p["reference"] in headlines and p["reference"] not in p["text"]
        # every reference word is in the document, so the lexicon critic never flags the reference
        document_words = set(re.findall(r"\w+", p["text"].lower()))
        assert set(re.findall(r"\w+", p["reference"].lower())) <= document_words, p
        assert len(p["text"].split()) < 45
    assert len({p["reference"] for p in prompts}) == len(news.EVENTS)
    corpus = news.generate_documents(1000, seed=0)
    scores = []
    for line in corpus:
        document, summary = line.split(" TL;DR: ")
        lead = next(lead for _, lead, _ in news.EVENTS.values() if lead in document)
        reference = next(h for h, l, _ in news.EVENTS.values() if l == lead)
        scores.append(rouge_n(summary, reference, 1))
    faithful = sum(s == 1.0 for s in scores) / len(scores)
    assert 0.35 < faithful < 0.45, faithful  # FAITHFUL_SHARE 0.4
    assert sum(s < 0.3 for s in scores) / len(scores) > 0.2  # filler and wrong_event summaries
    assert len({round(s, 2) for s in scores}) >= 4
    with pytest.raises(ConfigError, match="n=-1"):
        news.generate_documents(-1, seed=0)
