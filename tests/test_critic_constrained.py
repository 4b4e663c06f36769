"""critic.answer_format copy/json in drlc's hf backend: the automaton, its GBNF twin, and constrained decoding.

Span texts of a ``copy`` answer must be substrings of the response whatever the model wants to
write: checked on random walks through the automaton (any token it allows), on a random tiny
GPT-2 behind the hf backend, and against the GBNF grammar read by an independent regex translation.
"""

import importlib.util
import json
import random
import re
from functools import lru_cache

import pytest
import torch
from conftest import save_tiny_gpt2, train_bpe

from pipeline.core.errors import ConfigError, CriticError
from pipeline.critic.grammar import check_gbnf, copy_grammar, span_bounds
from pipeline.critic.constraint import constraint_for
from pipeline.critic.offline.constrained import SpanAutomaton, TokenTrie
from pipeline.critic.structured import request_body

torch.set_num_threads(1)

SOURCES = [
    "the cat and the cat and the cat",  # repeated words: many start positions
    'Hi!!! "quoted", (parens); semi: colon... \\ back\\slash',  # punctuation, quotes and backslashes
    "café — naïve 😀 über straße",  # unicode, an emoji
    "line one\nline two\ttab",  # control characters, escaped in JSON
    "a",  # shorter than most tokens
    "",  # nothing to copy: only {"spans": []}
]
LABELS = ("toxic", "insult")
CHAT = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}")


@lru_cache(maxsize=1)
def tokenizer():
    tok = train_bpe(SOURCES * 3 + ['{"spans": [{"label": "toxic", "text": "x"}]}'] * 3, vocab_size=400)
    tok.pad_token = tok.eos_token
    tok.chat_template = CHAT
    return tok


@lru_cache(maxsize=1)
def trie():
    return TokenTrie.of(tokenizer())


@lru_cache(maxsize=None)
def spelling_trie(source: str) -> TokenTrie:
    """The test vocabulary plus one token per character of ``source``.

    A word span cannot end inside a word, so it needs a token for each next character of the
    word; the tiny BPE has none for some non-ASCII letters (SmolLM2's 49k vocabulary has them).
    Where a real vocabulary lacks one, the hf backend ends the answer (a visible parse_error).
    """
    return TokenTrie(trie().pieces + sorted(set(source)))


def random_walk(automaton, rng, max_tokens=400) -> str:
    """Text of a random token sequence the automaton allows, to the end (or max_tokens)."""
    vocab = spelling_trie(automaton.source) if automaton.source is not None and automaton.words else trie()
    state, text = automaton.start, ""
    for _ in range(max_tokens):
        if automaton.is_done(state):
            return text
        allowed = vocab.allowed(automaton, state)
        assert allowed, f"dead end after {text!r}"
        piece = vocab.pieces[rng.choice(allowed)]
        for ch in piece:
            state = automaton.step(state, ch)
        text += piece
    raise AssertionError(f"no end after {max_tokens} tokens: {text[:200]!r}")


def _at_word_edges(span: str, source: str) -> bool:
    """Whether ``span`` occurs in ``source`` starting at a word's first character and ending after a word's last."""
    word = r"[^\W]"  # a letter, digit or _ (str.isalnum or _, as span_bounds has it)
    return re.search(rf"(?<!{word}){re.escape(span)}(?!{word})", source) is not None and \
        re.fullmatch(rf"{word}.*{word}|{word}", span, re.DOTALL) is not None


@pytest.mark.parametrize("words", [False, True], ids=["copy", "copy_words"])
@pytest.mark.parametrize("source", SOURCES)
def test_every_allowed_path_is_json_with_spans_copied_from_the_source(source, words):
    rng = random.Random(0)
    for _ in range(40):
        text = random_walk(SpanAutomaton(LABELS, 3, source, words=words), rng)
        spans = json.loads(text)["spans"]
        assert len(spans) <= 3
        for span in spans:
            assert span["label"] in LABELS and span["text"] and span["text"] in source, (text, source)
            assert not words or _at_word_edges(span["text"], source), (span["text"], source)
    if not source:
        assert random_walk(SpanAutomaton(LABELS, 3, source, words=words), rng) == '{"spans": []}'


def test_word_spans_start_and_end_at_word_edges():
    assert span_bounds("Hi, you!", words=True) == ([0, 4], {2, 7})
    assert span_bounds("... !", words=True) == ([], set())
    assert span_bounds("ab", words=False) == ([0, 1], {1, 2})
    automaton = SpanAutomaton(LABELS, 1, "tall cat.", words=True)
    state = automaton.start
    for ch in '{"spans": [{"label": "toxic", "text": "':
        state = automaton.step(state, ch)
    assert automaton.step(state, "a") is None and automaton.step(state, " ") is None  # not a word start
    t = automaton.step(state, "t")
    assert automaton.step(t, '"') is None and automaton.step(t, '"', closing=True) is None  # "t": half a word
    tall = state
    for ch in "tall":
        tall = automaton.step(tall, ch)
    assert automaton.step(tall, '"')[0] == "lit"
    cat = tall
    for ch in " cat":
        cat = automaton.step(cat, ch)
    assert automaton.step(cat, ".") is None  # no word after the full stop: a span cannot end there
    assert random_walk(SpanAutomaton(LABELS, 2, "... !", words=True), random.Random(0)) == '{"spans": []}'


def test_the_automaton_refuses_text_not_in_the_source_and_a_cut_escape():
    automaton = SpanAutomaton(LABELS, 2, 'say "hi"')
    state = automaton.start
    for ch in '{"spans": [{"label": "toxic", "text": "':
        state = automaton.step(state, ch)
    assert automaton.step(state, "x") is None  # no x in the source
    assert automaton.step(state, '"') is None  # an empty span
    inside = automaton.step(state, "\\")  # the start of \" (the source's quote)
    assert inside is not None and automaton.step(inside, '"') is not None  # continues the escape
    space = automaton.step(state, " ")
    assert automaton.step(space, '"') is None and automaton.step(space, '"', closing=True) is None  # blank span
    for ch in 'say':
        state = automaton.step(state, ch)
    assert automaton.step(state, '"')[0] == "lit"  # closes: "say" is a span


def _gbnf_regex(grammar: str) -> re.Pattern:
    """Translate drlc's non-recursive GBNF (literals, rule names, ( | ), ?) into a Python regex."""
    rules = dict(line.split(" ::= ", 1) for line in grammar.strip().splitlines())
    token = re.compile(r'"((?:\\.|[^"\\])*)"|([a-zA-Z0-9-]+)|([()|?])|\s+')

    def expand(name: str) -> str:
        out = []
        for literal, ref, op in token.findall(rules[name]):
            if op:
                out.append(op if op != "(" else "(?:")
            elif ref:
                out.append(f"(?:{expand(ref)})")
            elif literal or literal == "":
                unescaped = re.sub(r"\\(.)", lambda m: {"n": "\n", "r": "\r", "t": "\t"}.get(m[1], m[1]), literal)
                out.append(re.escape(unescaped)) if unescaped else None
        return "".join(out)

    return re.compile(expand("root"), re.DOTALL)


@pytest.mark.parametrize("words", [False, True], ids=["copy", "copy_words"])
@pytest.mark.parametrize("source", [s for s in SOURCES if len(s) < 40])
def test_the_gbnf_grammar_accepts_what_the_automaton_accepts_and_no_more(source, words):
    grammar = copy_grammar(source, LABELS, max_spans=2, words=words)
    check_gbnf(grammar)
    pattern = _gbnf_regex(grammar)
    rng = random.Random(1)
    for _ in range(30):
        assert pattern.fullmatch(random_walk(SpanAutomaton(LABELS, 2, source, words=words), rng))
    assert not pattern.fullmatch('{"spans": [{"label": "toxic", "text": "zzz-not-there"}]}')
    assert not pattern.fullmatch('{"spans": [{"label": "other", "text": "a"}]}') or "a" not in source
    assert pattern.fullmatch('{"spans": []}')
    # every span the grammar takes: all substrings of the source (one label, one span), at word edges or not
    taken = {source[i:j] for i in range(len(source)) for j in range(i + 1, len(source) + 1)
             if pattern.fullmatch('{"spans": [{"label": "toxic", "text": ' + json.dumps(source[i:j], ensure_ascii=False)
                                  + '}]}')}
    assert all(_at_word_edges(t, source) for t in taken) if words else taken == {
        source[i:j] for i in range(len(source)) for j in range(i + 1, len(source) + 1)}


@pytest.mark.parametrize("bad, message", [
    ('root ::= "a', "never closed"),
    ('root ::= "a\\q"', "bad escape"),
    ('root ::= ( "a"', "'\\(' without '\\)'"),
    ('root ::= item', r"undefined rule\(s\) \['item'\]"),
    ('start ::= "a"', "no 'root' rule"),
    ('root = "a"', "is not 'name ::= body'"),
    ('root ::= "a"\nroot ::= "b"', "defined twice"),
])
def test_check_gbnf_rejects_malformed_grammars(bad, message):
    with pytest.raises(ConfigError, match=message):
        check_gbnf(bad)


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                    reason="llama_cpp is not importable: pip install 'drlc[llamacpp]' (builds llama.cpp, ~15 CPU-min)")
def test_llama_cpp_parses_the_copy_grammar():
    from llama_cpp import LlamaGrammar

    for source in SOURCES:
        for words in (False, True):
            LlamaGrammar.from_string(copy_grammar(source, LABELS, max_spans=3, words=words), verbose=False)


def test_constraint_for_reads_the_bodies_the_client_sends():
    copy = constraint_for(request_body("copy", LABELS, source="abc"))
    assert copy.source == "abc" and copy.labels == LABELS and not copy.words
    assert constraint_for(request_body("copy_words", LABELS, source="abc")).words
    with pytest.raises(CriticError, match="words: bool"):  # a client of drlc's server that sends "yes"
        constraint_for({"drlc_copy": {"source": "abc", "labels": ["toxic"], "max_spans": 2, "words": "yes"}})
    free = constraint_for(request_body("json", LABELS, source="abc"))
    assert free.source is None and free.max_spans == 8
    assert constraint_for({"messages": []}) is None
    with pytest.raises(CriticError, match="does not read GBNF grammars"):
        constraint_for({"grammar": 'root ::= "a"'})
    with pytest.raises(CriticError, match="only drlc's span json_schema"):
        constraint_for({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}})


@lru_cache(maxsize=1)
def _model_dir(tmp_root) -> str:
    return save_tiny_gpt2(tmp_root / "tiny", tokenizer(), n_positions=512)


def _request(source: str, answer_format: str, max_spans: int = 2) -> dict:
    body = request_body(answer_format, LABELS, source=source)
    if "drlc_copy" in body:
        body["drlc_copy"]["max_spans"] = max_spans
    else:
        body["response_format"]["json_schema"]["schema"]["properties"]["spans"]["maxItems"] = max_spans
    return {"messages": [{"role": "user", "content": f"find spans in: {source}"}], "max_tokens": 300, **body}


def test_hf_backend_copy_answers_are_json_with_substring_spans_alone_and_in_a_batch(tmp_path_factory):
    from test_critic_hf_backend import answer_concurrently

    from pipeline.critic.offline.hf_backend import HFBackend

    model_dir = _model_dir(tmp_path_factory.mktemp("constrained"))
    requests = [_request(source, "copy") for source in SOURCES]
    requests.insert(2, {"messages": [{"role": "user", "content": "free text, unconstrained"}], "max_tokens": 20})
    alone = HFBackend(model_dir, max_batch_size=1)
    singles = [alone(request) for request in requests]
    together = HFBackend(model_dir, max_batch_size=len(requests), batch_window_s=30.0)
    batched = answer_concurrently(together, requests)
    assert together.batch_sizes == [len(requests)]
    assert batched == singles  # a constrained answer is the same in a batch as alone
    assert [alone(request) for request in requests[:2]] == singles[:2]  # greedy: the same answer again
    for request, answer in zip(requests, singles):
        if "drlc_copy" not in request:
            continue
        assert answer.finish_reason == "stop", answer
        spans = json.loads(answer.text)["spans"]
        source = request["drlc_copy"]["source"]
        assert all(span["text"] in source and span["label"] in LABELS for span in spans)
        assert spans or not source or answer.text == '{"spans": []}'


def test_hf_backend_copy_words_answers_are_whole_words_alone_and_in_a_batch(tmp_path_factory):
    from test_critic_hf_backend import answer_concurrently

    from pipeline.critic.offline.hf_backend import HFBackend

    model_dir = _model_dir(tmp_path_factory.mktemp("constrained-words"))
    sources = [s for s in SOURCES if s.isascii()]  # the tiny vocabulary spells every next character of these
    requests = [_request(source, "copy_words", max_spans=3) for source in sources]
    singles = [HFBackend(model_dir, max_batch_size=1)(request) for request in requests]
    together = HFBackend(model_dir, max_batch_size=len(requests), batch_window_s=30.0)
    assert answer_concurrently(together, requests) == singles
    spans = [(span["text"], source) for source, answer in zip(sources, singles)
             for span in json.loads(answer.text)["spans"]]
    assert spans and all(_at_word_edges(text, source) for text, source in spans), spans


def test_hf_backend_json_answers_close_before_the_token_limit(tmp_path_factory):
    """Within CLOSING_TOKENS of max_tokens a constrained answer may only close its object: never cut off."""
    from pipeline.critic.offline.hf_backend import HFBackend

    backend = HFBackend(_model_dir(tmp_path_factory.mktemp("constrained-json")), max_batch_size=1)
    for source, answer_format in [("the cat and the cat and the cat", "copy"), ("the cat", "json")]:
        for max_tokens in (45, 60):  # the opening literal alone is ~26 tokens of this tiny vocabulary
            request = _request(source, answer_format, max_spans=8) | {"max_tokens": max_tokens}
            answer = backend(request)
            assert answer.finish_reason == "stop" and answer.completion_tokens <= max_tokens, answer
            assert set(json.loads(answer.text)) == {"spans"}


def test_closing_refuses_a_new_span_and_ends_a_span_that_can_end():
    automaton = SpanAutomaton(LABELS, 3, "ab")
    state = automaton.start
    for ch in '{"spans": [':
        state = automaton.step(state, ch)
    assert automaton.step(state, "{", closing=True) is None and automaton.step(state, "]", closing=True)
    for ch in '{"label": "toxic", "text": "a':
        state = automaton.step(state, ch)
    assert automaton.step(state, "b") and automaton.step(state, "b", closing=True) is None
    assert automaton.step(state, '"', closing=True)


def test_sampled_answers_follow_their_seed_alone_and_in_a_batch(tmp_path_factory):
    """temperature > 0 (critic.samples): a seeded draw per row, the same alone and in a batch, greedy untouched."""
    from test_critic_hf_backend import answer_concurrently

    from pipeline.critic.offline.hf_backend import HFBackend

    model_dir = _model_dir(tmp_path_factory.mktemp("sampled"))
    requests = [_request("the cat and the cat and the cat", "copy") | {"temperature": 1.0, "seed": seed}
                for seed in (0, 1, 2)] + [_request("the cat", "copy")]
    alone = HFBackend(model_dir, max_batch_size=1)
    singles = [alone(request) for request in requests]
    together = HFBackend(model_dir, max_batch_size=4, batch_window_s=30.0)
    assert answer_concurrently(together, requests) == singles and together.batch_sizes == [4]
    assert len({answer.text for answer in singles[:3]}) > 1  # different seeds, different answers
    assert alone(requests[1]) == singles[1]  # the same seed, the same answer
    for answer in singles:
        spans = json.loads(answer.text)["spans"]
        assert all(span["text"] in "the cat and the cat and the cat" for span in spans)


def test_copy_through_drlc_serve_hf_and_the_real_client(tmp_path_factory, cache):
    """critic.answer_format copy end to end over loopback HTTP: every span the hf critic names is in the response."""
    from pipeline.critic.client import CriticClient
    from pipeline.critic.offline.server import serve_in_background
    from pipeline.critic.structured import read_structured, shape_requests

    model_dir = _model_dir(tmp_path_factory.mktemp("served"))
    sources = [s for s in SOURCES if s]
    requests = [[{"role": "user", "content": f"find spans in: {source}"}] for source in sources]
    requests, bodies = shape_requests(requests, sources, labels=LABELS, answer_format="copy")
    with serve_in_background(backend="hf", model_dir=model_dir) as (url, stats):
        client = CriticClient(base_url=url, model="tiny", sampling={"max_tokens": 300}, timeout_s=120)
        results = client.run(requests, cache, bodies=bodies)
        again = client.run(requests, cache, bodies=bodies)
        assert stats()["requests"] == len(sources)  # the second run is answered from the cache
    assert [r.raw_text for r in again] == [r.raw_text for r in results] and all(r.cache_hit for r in again)
    for source, result in zip(sources, results):
        assert result.status == "ok"
        parsed = read_structured(result.raw_text, labels=LABELS)
        assert parsed.status in ("ok", "none") and all(text in source for _, text in parsed.spans)
