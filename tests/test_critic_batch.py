"""Batch-API path: prepare a JSONL, answer it with the real local server, ingest, then no requests."""

import json
import urllib.request
from pathlib import Path

import pytest
from conftest import train_bpe

from pipeline.core.cache import MISSING, CriticCache
from pipeline.core.errors import ConfigError, DataError
from pipeline.critic.annotate import annotate_round
from pipeline.critic.batch import batch_ingest, batch_prepare, round_requests
from pipeline.critic.client import CriticClient
from pipeline.critic.offline import lexicon
from pipeline.critic.offline.server import serve_in_background
from pipeline.critic.templates import load_template

TEMPLATE = load_template(Path(__file__).resolve().parents[1] / "prompts" / "sentiment.md")
SAMPLING = {"temperature": 0.0, "max_tokens": 64}
TEXTS = ["The movie was awful and boring.", "The movie was good.", "A plot, a cast, a film.",
         "The movie was awful and boring.", "Fine acting but dull.", "A sad, slow and ugly ending."]
REWARDS = (-1.0, 0.5, -0.2, -1.0, 0.0, -0.7)


def rows():
    return [{"rollout_id": f"r{i}", "response": text, "response_ids": list(range(len(text.split()))),
             "env_reward": reward} for i, (text, reward) in enumerate(zip(TEXTS, REWARDS))]


def client_for(url):
    return CriticClient(base_url=url, model="critic-m", sampling=SAMPLING, timeout_s=5.0, template_sha=TEMPLATE.sha256)


def read_jsonl(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def answer_with_server(url, line, number):
    """Send a prepared body to the server with plain urllib; wrap the reply as a Batch-API output line."""
    request = urllib.request.Request(url + "/chat/completions", data=json.dumps(line["body"]).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as reply:
        body = json.loads(reply.read())
    return {"id": f"batch_req_{number}", "custom_id": line["custom_id"],
            "response": {"status_code": 200, "request_id": f"req_{number}", "body": body}, "error": None}


def write_jsonl(path, records):
    Path(path).write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def test_round_requests_pick_low_rewards_like_annotate_round():
    requests = round_requests(rows(), template=TEMPLATE, threshold=0.0)
    critiqued = [i for i, reward in enumerate(REWARDS) if reward <= 0.0]  # by hand: r0 r2 r3 r4 r5
    assert critiqued == [0, 2, 3, 4, 5]
    assert requests == [TEMPLATE.render({"response": TEXTS[i]}) for i in critiqued]
    with pytest.raises(DataError, match="env_reward"):
        round_requests([{"rollout_id": "x", "response": "y", "response_ids": []}], template=TEMPLATE, threshold=0.0)


def test_prepare_answer_ingest_then_a_live_round_sends_nothing(cache, tmp_path):
    requests = round_requests(rows(), template=TEMPLATE, threshold=0.0)  # 5 requests, 4 distinct texts
    with serve_in_background(backend="lexicon") as (url, stats):
        client = client_for(url)
        client.run(requests[:1], cache)  # one answer is already paid for: it stays out of the batch
        count = batch_prepare(requests, client=client_for("http://127.0.0.1:9/v1"), cache=cache,  # any port
                              out_path=tmp_path / "batch" / "input.jsonl")
        lines = read_jsonl(tmp_path / "batch" / "input.jsonl")
        assert count == len(lines) == 3
        for line in lines:
            assert set(line) == {"custom_id", "method", "url", "body"}
            assert (line["method"], line["url"]) == ("POST", "/v1/chat/completions")
            assert line["body"] == {"model": "critic-m", "messages": line["body"]["messages"], **SAMPLING}
            assert line["custom_id"] == client.key_for(line["body"]["messages"])
        assert {line["custom_id"] for line in lines} == {client.key_for(m) for m in requests} - {client.key_for(requests[0])}

        output = [answer_with_server(url, line, n) for n, line in enumerate(lines)]
        failures = [
            {"id": "batch_req_x", "custom_id": "a" * 64, "response": None,
             "error": {"code": "server_error", "message": "boom"}},
            {"id": "batch_req_y", "custom_id": "b" * 64, "error": None,
             "response": {"status_code": 200, "body": dict(output[0]["response"]["body"], choices=[
                 {"index": 0, "message": {"role": "assistant", "content": "Positive:"}, "finish_reason": "length"}])}},
            {"id": "batch_req_z", "custom_id": "c" * 64, "error": None,
             "response": {"status_code": 429, "body": {"error": {"message": "slow down"}}}},
        ]
        counts = batch_ingest(write_jsonl(tmp_path / "output.jsonl", output + failures + output[:1]), cache=cache)
        assert counts == {"ingested": 3, "failed": 3, "skipped": 1}
        assert all(cache.get(key) is MISSING for key in ("a" * 64, "b" * 64, "c" * 64))

        before = stats()["requests"]
        results = client.run(requests, cache)
        assert stats()["requests"] == before == 1 + 3  # the one live answer and the batch's three bodies
        assert client.last_stats.requests_sent == 0
        with CriticCache(tmp_path / "live") as live_cache:
            live = client.run(requests, live_cache)  # the same round answered live, for comparison
    assert all(r.status == "ok" and r.cache_hit for r in results)
    assert [r.raw_text for r in results] == [r.raw_text for r in live] == [lexicon.answer(m) for m in requests]
    assert [(r.prompt_tokens, r.completion_tokens, r.finish_reason) for r in results] == \
        [(r.prompt_tokens, r.completion_tokens, r.finish_reason) for r in live]


def bpe_tokenizer():
    """A small byte-level BPE trained on the test texts (no hub download)."""
    return train_bpe(TEXTS * 5)


def test_ingested_answers_serve_annotate_round_without_requests(cache, tmp_path):
    tokenizer = bpe_tokenizer()
    batch = [dict(row, response_ids=tokenizer.encode(row["response"])) for row in rows()]
    requests = round_requests(batch, template=TEMPLATE, threshold=0.0)
    with serve_in_background(backend="lexicon") as (url, stats):
        batch_prepare(requests, client=client_for(url), cache=cache, out_path=tmp_path / "in.jsonl")
        output = [answer_with_server(url, line, n) for n, line in enumerate(read_jsonl(tmp_path / "in.jsonl"))]
        assert batch_ingest(write_jsonl(tmp_path / "out.jsonl", output), cache=cache)["ingested"] == 4
        sent = stats()["requests"]
        annotations = annotate_round(batch, template=TEMPLATE, tokenizer=tokenizer, client=client_for(url),
                                     cache=cache, threshold=0.0, rewards={"positive": 1.0, "negative": -1.0},
                                     alignment="exact", progress=False)
        assert stats()["requests"] == sent == 4
    assert [a["status"] for a in annotations] == ["ok", "skipped", "none", "ok", "ok", "ok"]  # r2: nothing named
    assert all(a["cache_hit"] for a in annotations if a["critiqued"])
    assert annotations[0]["raw_text"] == 'Positive: none\nNegative: "awful"; "boring"'
    assert any(r < 0 for r in annotations[0]["token_rewards"])


def test_prepare_twice_writes_nothing_new_and_rejects_unknown_sampling(cache, tmp_path):
    requests = round_requests(rows(), template=TEMPLATE, threshold=0.0)
    with serve_in_background(backend="lexicon") as (url, _):
        client_for(url).run(requests, cache)
        assert batch_prepare(requests, client=client_for(url), cache=cache, out_path=tmp_path / "in.jsonl") == 0
    assert (tmp_path / "in.jsonl").read_text() == ""
    with pytest.raises(ConfigError, match="temprature"):  # the client checks what a batch body will carry
        CriticClient(base_url=url, model="critic-m", sampling={"temprature": 0})


GOOD = {"custom_id": "d" * 64, "response": {"status_code": 200, "body": {
    "model": "m", "choices": [{"index": 0, "message": {"role": "assistant", "content": "Positive: none"},
                               "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2}}}}


@pytest.mark.parametrize("bad, message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    (json.dumps({"custom_id": "request-1", "response": None}), "not a drlc cache key"),
    (json.dumps({"custom_id": "e" * 64, "response": {"status_code": 200, "body": {"id": "x"}}}),
     "not a chat completion"),
])
def test_malformed_output_lines_name_file_and_line_and_store_nothing(cache, tmp_path, bad, message):
    path = tmp_path / "out.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + bad + "\n")
    with pytest.raises(DataError, match=message) as error:
        batch_ingest(path, cache=cache)
    assert f"{path}:3" in str(error.value)
    assert cache.stats()["entries"] == 0


def test_missing_output_file_is_a_data_error(cache, tmp_path):
    with pytest.raises(DataError, match="cannot read Batch-API output"):
        batch_ingest(tmp_path / "absent.jsonl", cache=cache)


def test_ingested_value_has_the_client_layout(cache, tmp_path):
    path = write_jsonl(tmp_path / "out.jsonl", [GOOD])
    assert batch_ingest(path, cache=cache) == {"ingested": 1, "failed": 0, "skipped": 0}
    assert cache.get("d" * 64) == {"raw_text": "Positive: none", "finish_reason": "stop",
                                   "usage": {"prompt_tokens": 3, "completion_tokens": 2}, "model": "m",
                                   "system_fingerprint": None, "latency_s": 0.0}
