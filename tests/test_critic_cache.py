"""Critic cache: key recipe, what is stored, counters across processes, Parquet sharing."""

import contextlib
import doctest
import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

import pipeline.core.cache as cache_module
from pipeline.core.cache import MISSING, SCHEMA_VERSION, CriticCache, cache_key, export_parquet, import_parquet
from pipeline.core.errors import CacheError, StoreError

REPO = Path(__file__).resolve().parents[1]
MESSAGES = [{"role": "system", "content": "Task: sentiment"}, {"role": "user", "content": "Un café très bon"}]
TEMPLATE_SHA = hashlib.sha256(b"Task: sentiment {response}").hexdigest()
BASE = dict(model="critic-m", messages=MESSAGES, template_sha=TEMPLATE_SHA, namespace="",
            temperature=0.0, top_p=1.0, max_tokens=64, seed=3, stop=["\n\n"], n=1, sample_index=0)


def answer(text="Positive: none", prompt_tokens=5, completion_tokens=2):
    return {"raw_text": text, "finish_reason": "stop", "model": "critic-m", "system_fingerprint": "fp",
            "latency_s": 0.25, "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}}


def test_key_is_sha256_of_canonical_json_computed_by_hand():
    canonical = (
        '{"messages":[{"content":"Task: sentiment","role":"system"},'
        '{"content":"Un café très bon","role":"user"}],"model":"critic-m","namespace":"","sample_index":0,'
        '"sampling":{"max_tokens":64,"n":1,"seed":3,"stop":["\\n\\n"],"temperature":0.0,"top_p":1.0},'
        f'"schema":{SCHEMA_VERSION},"template_sha":"{TEMPLATE_SHA}"}}'
    )
    assert SCHEMA_VERSION == 2  # 1 had the endpoint URL in the key; its entries are never hit
    assert cache_key(**BASE) == hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    assert cache_key(**BASE) == cache_key(**dict(reversed(list(BASE.items()))))


@pytest.mark.parametrize("field, other", [
    ("model", "critic-n"), ("template_sha", "0" * 64), ("template_sha", ""), ("namespace", "team-b"),
    ("messages", [{"role": "user", "content": "Un café très bon"}]),
    ("messages", [{"role": "system", "content": "Task: sentiment"}, {"role": "user", "content": "Un café très bon!"}]),
    ("temperature", 0.7), ("top_p", 0.9), ("max_tokens", 65), ("seed", 4), ("stop", ["\n"]), ("n", 2),
    ("sample_index", 1), ("temperature", None),
])
def test_every_field_changes_the_key(field, other):
    assert cache_key(**(BASE | {field: other})) != cache_key(**BASE)


def test_key_has_no_endpoint_so_a_moved_server_still_hits():
    with pytest.raises(TypeError, match="endpoint"):
        cache_key(**BASE, endpoint="http://127.0.0.1:8000/v1")
    with pytest.raises(TypeError, match="template_sha"):  # explicit: a forgotten template hash is an error
        cache_key(**{k: v for k, v in BASE.items() if k != "template_sha"})


def test_key_has_no_api_key_or_header_parameter():
    with pytest.raises(TypeError):
        cache_key(**BASE, api_key="sk-x")
    with pytest.raises(TypeError):
        cache_key(**BASE, headers={"Authorization": "Bearer sk-x"})


def test_get_put_contains_and_first_answer_wins(tmp_path):
    with CriticCache(tmp_path / "c") as cache:
        assert cache.get("k") is MISSING and cache.get("k", None) is None and "k" not in cache
        assert cache.put("k", answer("first")) is True
        assert cache.put("k", answer("second")) is False
        assert "k" in cache and cache.get("k")["raw_text"] == "first"
        assert set(cache.get("k")) == {"raw_text", "finish_reason", "usage", "model", "system_fingerprint", "latency_s"}


@pytest.mark.parametrize("bad", [answer(""), answer("   "), {"raw_text": "x"}, "text", answer() | {"usage": {}}])
def test_incomplete_or_empty_answers_are_never_stored(tmp_path, bad):
    with CriticCache(tmp_path) as cache:
        with pytest.raises(CacheError):
            cache.put("k", bad)
        assert "k" not in cache and cache.stats()["entries"] == 0


def test_unwritable_directory_raises_cache_error_naming_it(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(CacheError, match="a_file"):
        CriticCache(blocker / "cache")


def test_stats_count_hits_misses_requests_and_saved_tokens(tmp_path):
    with CriticCache(tmp_path) as cache:
        cache.put("a", answer(prompt_tokens=7, completion_tokens=3))
        cache.get("a"), cache.get("a"), cache.get("b")
        cache.tally(requests=4)
        cache.tally(cost_usd_saved=0.0125)
        assert cache.stats() == {"entries": 1, "hits": 2, "misses": 1, "requests": 4, "prompt_tokens": 14,
                                 "completion_tokens": 6, "cost_usd_saved": 0.0125}
    with CriticCache(tmp_path) as reopened:  # counters live on disk
        assert reopened.stats()["hits"] == 2 and reopened.stats()["requests"] == 4


def snippet_in_a_process(code: str, *args: str) -> tuple[int, str, str]:
    """`python -c CODE ARGS` in the checkout: (exit code, stdout, stderr)."""
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout, done.stderr


def snippet_in_this_process(code: str, *args: str) -> tuple[int, str, str]:
    """The same snippet run in this process (an error propagates): what it opens, it opens afresh."""
    out, argv = io.StringIO(), sys.argv
    sys.argv = ["-c", *args]
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
    finally:
        sys.argv = argv
    return 0, out.getvalue(), ""


RUN_SNIPPET = pytest.mark.parametrize(
    "run_snippet", [snippet_in_this_process, pytest.param(snippet_in_a_process, marks=pytest.mark.slow)],
    ids=["this_process", "child_process"])


@RUN_SNIPPET
def test_counters_and_answers_are_shared_between_processes(tmp_path, run_snippet):
    with CriticCache(tmp_path) as cache:
        cache.put("shared", answer("from parent"))
    child = (
        "import sys; from pipeline.core.cache import CriticCache\n"
        "with CriticCache(sys.argv[1]) as c:\n"
        "    print(c.get('shared')['raw_text']); c.get('nope'); c.put('child', c.get('shared') | {'raw_text': 'kid'})\n"
    )
    for _ in range(2):
        code, stdout, stderr = run_snippet(child, str(tmp_path))
        assert code == 0, stderr
        assert stdout.strip() == "from parent"
    with CriticCache(tmp_path) as cache:
        assert cache.get("child")["raw_text"] == "kid"
        stats = cache.stats()
    assert (stats["entries"], stats["hits"], stats["misses"]) == (2, 5, 2)


def test_parquet_export_import_round_trip(tmp_path):
    with CriticCache(tmp_path / "src") as source:
        source.put("k1", answer("one")), source.put("k2", answer("two", 9, 4) | {"system_fingerprint": None})
        assert export_parquet(source, tmp_path / "answers.parquet") == 2
    with CriticCache(tmp_path / "dst") as target:
        target.put("k1", answer("kept"))
        assert import_parquet(target, tmp_path / "answers.parquet") == 1
        assert target.get("k1")["raw_text"] == "kept"
        assert target.get("k2") == answer("two", 9, 4) | {"system_fingerprint": None}


def test_import_of_a_bad_file_raises_store_error(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    with CriticCache(tmp_path / "c") as cache:
        with pytest.raises(StoreError, match="missing.parquet"):
            import_parquet(cache, tmp_path / "missing.parquet")
        pq.write_table(pa.table({"cache_key": ["k"], "raw_text": ["x"]}), tmp_path / "thin.parquet")
        with pytest.raises(StoreError, match="finish_reason"):
            import_parquet(cache, tmp_path / "thin.parquet")


def test_docstring_examples_run():
    result = doctest.testmod(cache_module)
    assert result.attempted >= 4 and result.failed == 0


def test_public_api_is_small():
    assert 6 <= len(cache_module.__all__) <= 8
    json.dumps(cache_module.__all__)
