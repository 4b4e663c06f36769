"""The answer bound (issue 43): a constrained critic answer always closes within critic.max_tokens.

The bound (pipeline.critic.structured.answer_bound) limits how many spans and how many bytes a span may hold,
so the longest answer the grammar, the JSON schema and drlc's automaton admit is at most max_tokens - 1 bytes,
hence tokens (every token carries at least one byte), leaving one for the end of sequence. Checked here with
numbers computed by hand and with an adversarial decoder that always takes the shortest token the automaton
allows and never closes while it may go on: the most tokens any decoder can spend.
"""
import json
import re

import pytest
from test_critic_constrained import SOURCES, spelling_trie, trie

from pipeline.core.config import load_params
from pipeline.core.errors import ConfigError
from pipeline.critic.client import CriticClient
from pipeline.critic.grammar import copy_grammar
from pipeline.critic.constraint import (answer_bound, bounded_body, breaks_constraint, constraint_for, request_body)
from pipeline.critic.offline.constrained import SpanAutomaton
from pipeline.critic.servers import body_for

LABELS = ("toxic", "insult")


def test_the_bound_at_the_smol_profile_s_128_tokens_by_hand():
    # 127 bytes (one token kept for the end of sequence); frame {"spans": [ + ]} = 11 + 2 = 13;
    # per span {"label": " 11 + label + ", "text": " 12 + "} 2 (+ ", " 2 between spans).
    # toxic (5): 3 spans leave (127 - 13 + 2) // 3 - 32 = 6 < 16 bytes each; 2 spans leave 116 // 2 - 32 = 26.
    assert answer_bound(["toxic"], 128) == (2, 26)
    longest = json.dumps({"spans": [{"label": "toxic", "text": "x" * 26}] * 2}, ensure_ascii=False)
    assert len(longest.encode()) == 127
    # insult (6) is the longest label: 116 // 2 - 33 = 25
    assert answer_bound(LABELS, 128) == (2, 25)
    # 256 tokens: (256 - 12) // 5 - 32 = 16 -> 5 spans of 16 bytes; 6 spans would leave 8
    assert answer_bound(["toxic"], 256) == (5, 16)


def test_a_max_tokens_that_holds_not_even_one_span_is_one_line_naming_the_key():
    # one span of one byte: 1 (end) + 13 + 25 + 5 + 1 = 45 tokens
    assert answer_bound(["toxic"], 45) == (1, 1)
    with pytest.raises(ConfigError) as error:
        answer_bound(["toxic"], 44)
    line = str(error.value)
    assert "\n" not in line and "critic.max_tokens 44" in line and "at least 45" in line


def test_drlc_check_refuses_such_a_profile(tmp_path):
    from dataclasses import replace

    from pipeline.steps.preflight import check_critic

    params = load_params("configs/smol-selfcritique.yaml")
    params = replace(params, critic=replace(params.critic, max_tokens=30, cache_dir=str(tmp_path / "c")))
    with pytest.raises(ConfigError, match=r"critic.max_tokens 30 cannot hold one constrained span"):
        check_critic(params, ".")
    check_critic(replace(params, critic=replace(params.critic, answer_format="text")), ".")  # text has no bound


def longest_walk(automaton: SpanAutomaton, limit: int) -> tuple[str, int]:
    """(text, tokens) of the adversarial decoder: shortest allowed token, never a closing one while another is."""
    vocab = spelling_trie(automaton.source) if automaton.source is not None and automaton.words else trie()
    state, text, tokens = automaton.start, "", 0
    while not automaton.is_done(state) and tokens < limit:
        allowed = vocab.allowed(automaton, state)
        assert allowed, f"dead end after {text!r}"
        pieces = sorted((vocab.pieces[t] for t in allowed), key=lambda p: (len(p), p))
        going_on = [p for p in pieces if p[0] not in '"]']
        piece = (going_on or pieces)[0]
        for ch in piece:
            state = automaton.step(state, ch)
        text, tokens = text + piece, tokens + 1
    return text, tokens


@pytest.mark.parametrize("max_tokens", [46, 60, 128])  # 46: one span of one byte with "insult"
@pytest.mark.parametrize("words", [False, True])
def test_the_longest_answer_any_decoder_can_write_closes_within_max_tokens(max_tokens, words):
    source = "the cat and the catastrophic cat and the cat " * 3 + 'Hi!!! "quoted" café'
    spans, length = answer_bound(LABELS, max_tokens)
    body = request_body("copy_words" if words else "copy", LABELS, source=source, max_spans=spans,
                        max_span_bytes=length)
    text, tokens = longest_walk(constraint_for(body), max_tokens)
    assert tokens <= max_tokens - 1 and not breaks_constraint(body, text, "stop"), (tokens, text)
    answer = json.loads(text)
    assert len(answer["spans"]) == (0 if words and length == 1 else spans)  # no word of the source is 1 byte
    assert all(len(json.dumps(s["text"], ensure_ascii=False).encode()) - 2 <= length for s in answer["spans"])


@pytest.mark.parametrize("source", SOURCES)
def test_every_source_s_longest_answer_fits_128(source):
    spans, length = answer_bound(LABELS, 128)
    body = request_body("copy", LABELS, source=source, max_spans=spans, max_span_bytes=length)
    text, tokens = longest_walk(constraint_for(body), 128)
    assert tokens <= 127 and len(text.encode()) <= 127 and constraint_for(body).max_span_bytes == 25


def test_the_grammar_holds_only_spans_within_the_bound():
    # "ab cd efghij": word spans within 5 bytes: "ab", "ab cd" (5), "cd", none from "efghij" (6)
    grammar = copy_grammar("ab cd efghij", ["toxic"], max_spans=2, words=True, max_span_bytes=5)
    text_rule = next(line for line in grammar.splitlines() if line.startswith("text ::="))
    assert text_rule == "text ::= s0 | s3"
    assert 's0 ::= "a" ( "b" ( " " ( "c" ( "d" ) ) )? )' in grammar
    assert 's3 ::= "c" ( "d" )' in grammar and "s6" not in grammar
    automaton = SpanAutomaton(["toxic"], 2, "ab cd efghij", words=True, max_span_bytes=5)
    state = automaton.start
    for ch in '{"spans": [{"label": "toxic", "text": "':
        state = automaton.step(state, ch)
    assert automaton.step(state, "e") is None and automaton.step(state, "a") is not None


def test_the_json_schema_and_vllm_body_carry_the_bound():
    body = bounded_body(request_body("json", ["toxic"], source=""), 128)
    schema = body["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["spans"]["maxItems"] == 2
    assert schema["properties"]["spans"]["items"]["properties"]["text"] == {"type": "string", "minLength": 1,
                                                                            "maxLength": 26}
    assert body_for("vllm", body)["structured_outputs"] == {"json": schema, "disable_any_whitespace": True}
    ok = '{"spans": [{"label": "toxic", "text": "' + "x" * 26 + '"}]}'
    assert not breaks_constraint(body, ok, "stop")
    assert breaks_constraint(body, ok.replace("x" * 26, "x" * 27), "stop")
    assert breaks_constraint(body, '{"spans": [{"label": "toxic", "text": ""}]}', "stop")
    assert constraint_for(body).max_span_bytes == 26 and constraint_for(body).max_spans == 2


def test_the_client_bounds_constrained_bodies_only_and_keys_follow_the_body():
    body = request_body("copy_words", ["toxic"], source="you absolute clown")
    bounded = CriticClient(base_url="http://127.0.0.1:9/v1", model="m", sampling={"max_tokens": 128})
    free = CriticClient(base_url="http://127.0.0.1:9/v1", model="m", sampling={})
    messages = [{"role": "user", "content": "x"}]
    assert bounded.key_for(messages) == CriticClient(base_url="http://127.0.0.1:9/v1", model="m",
                                                     sampling={"max_tokens": 128}).key_for(messages, body={})
    assert bounded.key_for(messages, body=body) != bounded.key_for(messages, body=bounded_body(body, 256))
    assert free.key_for(messages, body=body) == free.key_for(messages, body=bounded_body(body, None))
    sent = bounded_body(body, 128)
    assert sent["drlc_copy"]["max_spans"] == 2 and sent["drlc_copy"]["max_span_bytes"] == 26
    assert bounded_body(sent, 128) == sent  # bounding is idempotent
    assert re.search(r'^s0 ::= "y"', sent["grammar"], re.M)


def test_a_replay_of_bounded_answers_sends_nothing(tmp_path):
    """The bound is computed from the run's own max_tokens, so a replay (a client that may send nothing) finds
    every bounded answer under the key it was cached by; the lexicon backend honours the bounded span count."""
    from pipeline.core.cache import CriticCache
    from pipeline.critic.offline.server import serve_in_background
    from pipeline.critic.structured import shape_requests

    posts = ["you absolute clown, you idiot", "a fine day", "shut up, moron"]
    requests, bodies = shape_requests([[{"role": "system", "content": "Task: toxicity"},
                                        {"role": "user", "content": f"<response>{p}</response>"}] for p in posts], posts,
                                      labels=["toxic"], answer_format="copy_words")
    settings = dict(model="m", server="drlc", sampling={"max_tokens": 128, "temperature": 0.0})
    with serve_in_background(backend="lexicon") as (url, stats), CriticCache(tmp_path / "cache") as cache:
        first = CriticClient(base_url=url, **settings).run(requests, cache, bodies=bodies)
        sent = stats()["requests"]
        replay = CriticClient(base_url=url, max_requests=0, **settings).run(requests, cache, bodies=bodies)
        assert stats()["requests"] == sent and [r.status for r in first] == ["ok"] * 3
        assert [r.raw_text for r in replay] == [r.raw_text for r in first] and all(r.cache_hit for r in replay)
        assert all(len(json.loads(r.raw_text)["spans"]) <= 2 for r in first)
