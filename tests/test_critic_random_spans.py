"""The random-span control critic: the tagger's span count and lengths at random, seeded places, served on
loopback like the tagger and audited by `drlc critic eval`."""
import dataclasses
from collections import Counter

import pytest

from pipeline.audit.critic_eval import audit_critic
from pipeline.audit.distill import distill
from pipeline.core.errors import CriticError
from pipeline.critic.offline.random_spans import random_spans, span_word_lengths, words
from pipeline.critic.offline.server import make_server
from pipeline.critic.offline.tagger import SpanTagger
from pipeline.critic.parse import parse_answer
from pipeline.critic.templates import load_template
from pipeline.steps.critique import critic_model_id
from tests.e2e import ROOT
from tests.test_critic_tagger import synthetic, tagger_critic, write_posts

TEXT = "you are a moron and a total fool , we saw it today in the rain"


def test_count_labels_and_word_lengths_equal_the_input_spans_inside_the_text():
    spans = [("toxic", 10, 15), ("toxic", 22, 32)]  # "moron", "total fool" (1 and 2 words)
    tokens = words(TEXT)
    assert "," not in [TEXT[s:e] for s, e in tokens] and len(tokens) == 15
    starts, ends = {s for s, _ in tokens}, {e for _, e in tokens}
    for seed in range(50):
        moved = random_spans(TEXT, spans, seed=seed)
        assert len(moved) == 2 and {label for label, _, _ in moved} == {"toxic"}
        assert sorted(span_word_lengths(tokens, moved)) == [1, 2]
        assert all(0 <= s < e <= len(TEXT) and s in starts and e in ends for _, s, e in moved)  # whole words
        assert moved == sorted(moved, key=lambda span: span[1]) and moved[0][2] <= moved[1][1]  # no overlap


def test_same_text_and_seed_give_the_same_spans_and_another_seed_or_text_others():
    spans = [("toxic", 10, 15)]
    assert random_spans(TEXT, spans, seed=3) == random_spans(TEXT, spans, seed=3)
    assert len({tuple(random_spans(TEXT, spans, seed=s)) for s in range(20)}) > 5
    assert random_spans("", [], seed=0) == []
    with pytest.raises(CriticError, match="do not fit"):
        random_spans("a b", [("toxic", 0, 3), ("toxic", 0, 3)], seed=0)


def test_every_position_is_about_equally_likely():
    text = " ".join(f"w{i}" for i in range(10))  # 10 one-token words
    starts = Counter(random_spans(text, [("toxic", 0, 2)], seed=seed)[0][1] for seed in range(3000))
    assert len(starts) == 10
    assert all(0.08 < n / 3000 < 0.12 for n in starts.values())  # 0.1 each; 3 sigma is about +-0.016
    # two spans of 2 tokens in 6 tokens: C(2 + 2, 2) x 2 orders = 12 arrangements, each about 1/12
    text, spans = "a b c d e f", [("x", 0, 3), ("y", 4, 7)]
    drawn = Counter(tuple(random_spans(text, spans, seed=seed)) for seed in range(2400))
    assert len(drawn) == 12 and all(140 < n < 260 for n in drawn.values())


def test_a_lone_punctuation_mark_is_never_a_span():
    text = "you . moron , ! a ( fool ) ."  # 4 words among 6 punctuation marks
    for seed in range(200):
        moved = random_spans(text, [("toxic", 6, 11), ("toxic", 20, 24)], seed=seed)
        assert all(any(c.isalnum() for c in text[s:e]) for _, s, e in moved)
        assert len(moved) == 2 and moved[0][2] <= moved[1][1]


def _served(backend, model_dir, text, **request):
    template = load_template(str(ROOT / "prompts" / "toxicity.md"), task="toxicity")
    server = make_server(backend=backend, model_dir=str(model_dir), labels=("toxic",))
    try:
        answer = server.complete_fn({"messages": template.render({"response": text}), **request}).text
    finally:
        server.server_close()
    return list(parse_answer(answer, labels=("toxic",)).spans)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tagger") / "model"
    distill(synthetic(200), labels=("toxic",), out_dir=folder, source="synthetic", max_iter=50, min_count=1)
    return folder


def test_served_answers_match_the_taggers_counts_and_lengths_at_other_places(model):
    tagger = SpanTagger.load(model)
    moved = same = 0
    for text, _ in synthetic(40, seed=5):
        found, tokens = tagger.spans(text), words(text)
        expected = random_spans(text, found, seed=0)
        served = _served("random_spans", model, text)
        assert len(expected) == len(found)
        assert sorted(span_word_lengths(tokens, expected)) == sorted(span_word_lengths(tokens, found))
        # the answer names each text once, as the tagger's does; the aligner finds every occurrence
        assert [t for _, t in served] == list(dict.fromkeys(text[s:e] for _, s, e in expected))
        moved += sum(1 for span in expected if span not in found)
        same += sum(1 for span in expected if span in found)
    assert moved > 3 * same  # a one-word span in a 7-word post lands on the tagger's about 1 time in 7
    text = "we saw a moron today and you fool and it rained"
    assert _served("random_spans", model, text, drlc_seed=1) != _served("random_spans", model, text, drlc_seed=2)
    server = make_server(backend="random_spans", model_dir=str(model))
    with pytest.raises(CriticError, match="drlc_seed='one' is not an integer"):
        server.complete_fn({"messages": [{"role": "user", "content": "<response>\nx\n</response>"}],
                            "drlc_seed": "one"})
    server.server_close()


def test_audited_through_the_real_server_it_scores_below_the_tagger_and_replays_from_the_cache(tmp_path, model):
    posts = write_posts(tmp_path / "posts.jsonl", synthetic(40, seed=7))
    tagger = tagger_critic(tmp_path / "t", model)
    control = dataclasses.replace(tagger_critic(tmp_path / "r", model), backend="random_spans",
                                  extra_body={"drlc_seed": 4})
    _, tagged = audit_critic(spans_path=posts, critic=tagger, references=False, progress=False)
    _, first = audit_critic(spans_path=posts, critic=control, references=False, progress=False)
    tagged, scores = tagged["critics"]["configured"], first["critics"]["configured"]
    assert scores["requests_sent"] == 40 and scores["status_share"]["parse_error"] == 0
    assert tagged["char_f1"] > 0.9 and scores["char_f1"] < tagged["char_f1"] - 0.3
    _, again = audit_critic(spans_path=posts, critic=control, references=False, progress=False)
    assert again["critics"]["configured"]["requests_sent"] == 0
    assert again["critics"]["configured"]["char_f1"] == scores["char_f1"]
    model_id = critic_model_id(control)
    assert model_id.startswith("drlc-local:random_spans:") and model_id.endswith(":seed=4")
    assert model_id.split(":")[2] == critic_model_id(tagger).split(":")[2]  # the tagger's model hash
    other = dataclasses.replace(control, extra_body={"drlc_seed": 5})
    assert critic_model_id(other) != model_id
    _, reseeded = audit_critic(spans_path=posts, critic=other, references=False, progress=False)
    assert reseeded["critics"]["configured"]["requests_sent"] == 40  # another seed is another critic


def test_without_a_model_folder_it_is_a_one_line_error():
    with pytest.raises(CriticError, match="'random_spans' needs model_dir"):
        make_server(backend="random_spans")
