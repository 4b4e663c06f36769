"""annotate_round end to end: real template, real tokenizer, lexicon critic behind a real local server."""

from functools import lru_cache
from pathlib import Path

import pytest
from conftest import train_bpe
from transformers import PreTrainedTokenizerFast

from pipeline.core.errors import DataError
from pipeline.critic.annotate import ANNOTATION_FIELDS, annotate_round
from pipeline.critic.client import CriticClient, CriticResult
from pipeline.critic.offline.server import serve_in_background
from pipeline.critic.templates import load_template

TEMPLATE = load_template(Path(__file__).resolve().parents[1] / "prompts" / "sentiment.md")
REWARDS = {"positive": 1.0, "negative": -1.0}
FAST = dict(model="critic-m", backoff_base_s=0.005, backoff_max_s=1.0, timeout_s=5.0)
TEXTS = ["The movie was awful and boring.", "The movie was good.", "A plot, a cast, a film.",
         "The movie was awful and boring.", "Fine acting but dull."]


@lru_cache(maxsize=1)
def tokenizer() -> PreTrainedTokenizerFast:
    """A small byte-level BPE trained on the test texts (no hub download)."""
    return train_bpe(TEXTS * 5)


def rows(rewards=(-1.0, 0.5, -0.2, -1.0, 0.0)):
    return [{"rollout_id": f"r{i}", "response": text, "response_ids": tokenizer().encode(text), "env_reward": reward}
            for i, (text, reward) in enumerate(zip(TEXTS, rewards))]


def annotate(client, cache, batch=None):
    return annotate_round(rows() if batch is None else batch, template=TEMPLATE, tokenizer=tokenizer(),
                          client=client, cache=cache, threshold=0.0, rewards=REWARDS, alignment="exact",
                          progress=False)


def test_low_reward_rows_are_critiqued_once_and_aligned(cache):
    with serve_in_background(backend="lexicon") as (url, stats):
        client = CriticClient(base_url=url, **FAST)
        out = annotate(client, cache)
        assert stats()["requests"] == 3  # r0 and r3 are the same text: one request
    assert [a["rollout_id"] for a in out] == ["r0", "r1", "r2", "r3", "r4"]
    assert all(tuple(a) == ANNOTATION_FIELDS for a in out)
    assert [a["critiqued"] for a in out] == [True, False, True, True, True]
    assert [a["status"] for a in out] == ["ok", "skipped", "none", "ok", "ok"]  # r2: the answer names nothing
    skipped = out[1]
    assert skipped["cache_key"] == "" and skipped["token_rewards"] == [0.0] * len(rows()[1]["response_ids"])
    first = out[0]
    assert first["cache_key"] == out[3]["cache_key"] and first["template_sha"] == TEMPLATE.sha256
    assert first["critic_model"] == "critic-m" and first["raw_text"] == 'Positive: none\nNegative: "awful"; "boring"'
    assert {(s["label"], s["text"]) for s in first["spans"]} == {("negative", "awful"), ("negative", "boring")}
    ids = rows()[0]["response_ids"]
    assert len(first["token_rewards"]) == len(ids)
    decoded = [tokenizer().decode([i]) for i in ids]
    negative = "".join(piece for piece, r in zip(decoded, first["token_rewards"]) if r < 0)
    assert negative.split() == ["awful", "boring"]  # rewarded tokens, read back independently
    assert all(r == 0.0 for piece, r in zip(decoded, first["token_rewards"]) if piece.strip() in ("The", "movie"))
    assert out[2]["spans"] == [] and set(out[2]["token_rewards"]) == {0.0}  # lexicon finds nothing here
    assert first["items"] == [{"label": "negative", "text": "awful"}, {"label": "negative", "text": "boring"}]
    assert first["dropped"] == [] and out[2]["items"] == [] and first["attempts"] == 1


def test_second_round_is_all_cache_hits_and_deterministic(cache):
    with serve_in_background(backend="lexicon") as (url, stats):
        client = CriticClient(base_url=url, **FAST)
        first = annotate(client, cache)
        second = annotate(client, cache)
        third = annotate(client, cache)
        assert stats()["requests"] == 3
    assert second == third
    assert all(a["cache_hit"] for a in second if a["critiqued"])
    assert all(a["attempts"] == 0 for a in second)  # a cache hit sends nothing
    assert [{**a, "cache_hit": False, "cost_usd": 0.0, "attempts": 0} for a in first] == \
           [{**a, "cache_hit": False, "cost_usd": 0.0, "attempts": 0} for a in second]


def test_unparseable_answer_is_a_parse_error_with_zero_rewards(cache):
    with serve_in_background(backend=lambda messages: "I think it is fine.") as (url, _):
        out = annotate(CriticClient(base_url=url, **FAST), cache)
    critiqued = [a for a in out if a["critiqued"]]
    assert {a["status"] for a in critiqued} == {"parse_error"}
    assert all(a["raw_text"] == "I think it is fine." and a["error"] for a in critiqued)
    assert all(set(a["token_rewards"]) == {0.0} and a["spans"] == [] for a in critiqued)
    assert cache.stats()["entries"] == 3  # the raw answer is cached: a parser fix needs no new call


def test_api_errors_and_budget_are_recorded_not_raised(cache):
    with serve_in_background(backend="lexicon", error_rate=1.0) as (url, _):
        failed = annotate(CriticClient(base_url=url, **(FAST | {"max_retries": 1})), cache)
    assert [a["status"] for a in failed] == ["api_error", "skipped", "api_error", "api_error", "api_error"]
    assert all(a["cache_key"] and a["error"].startswith("http_500") and set(a["token_rewards"]) == {0.0}
               for a in failed if a["critiqued"])
    with serve_in_background(backend="lexicon") as (url, _):
        budgeted = annotate(CriticClient(base_url=url, max_concurrency=1, max_requests=2, **FAST), cache)
    assert [a["status"] for a in budgeted] == ["ok", "skipped", "none", "ok", "budget"]
    assert budgeted[4]["critic_model"] == "critic-m" and "max_requests" in budgeted[4]["error"]


def test_row_costs_add_up_to_what_the_client_paid(cache):
    with serve_in_background(backend="lexicon") as (url, _):
        client = CriticClient(base_url=url, prices={"critic-m": (0.15, 0.60)}, **FAST)
        out = annotate(client, cache)
    assert client.last_stats.cost_usd > 0
    assert sum(a["cost_usd"] for a in out) == pytest.approx(client.last_stats.cost_usd)
    paid = [a for a in out if a["cost_usd"] > 0]
    assert all(a["cost_usd"] == pytest.approx((0.15 * a["prompt_tokens"] + 0.60 * a["completion_tokens"]) / 1e6)
               for a in paid)
    assert out[3]["cost_usd"] == 0.0 and out[3]["prompt_tokens"] == out[0]["prompt_tokens"]


def test_nothing_to_critique_sends_nothing(cache):
    client = CriticClient(base_url="http://127.0.0.1:9/v1", **FAST)  # nothing listens there
    out = annotate(client, cache, rows(rewards=(1.0, 1.0, 1.0, 1.0, 1.0)))
    assert {a["status"] for a in out} == {"skipped"}


def test_row_missing_a_field_raises_data_error(cache):
    bad = rows()
    del bad[2]["response_ids"]
    with pytest.raises(DataError, match="row 2.*response_ids"):
        annotate(CriticClient(base_url="http://127.0.0.1:9/v1", **FAST), cache, bad)


def test_zero_mean_centres_each_critiqued_response_on_the_same_cache_keys(cache):
    with serve_in_background(backend="lexicon") as (url, stats):
        client = CriticClient(base_url=url, **FAST)
        plain = annotate(client, cache)
        centred = annotate_round(rows(), template=TEMPLATE, tokenizer=tokenizer(), client=client, cache=cache,
                                 threshold=0.0, rewards=REWARDS, alignment="exact", progress=False, zero_mean=True)
        assert stats()["requests"] == 3  # post-processing of cached answers: no new request
    assert [a["cache_key"] for a in centred] == [a["cache_key"] for a in plain]
    assert all(a["cache_hit"] for a in centred if a["critiqued"])
    # r0 "The movie was awful and boring.": m tokens carry -1 (awful, boring), n tokens in all;
    # by hand the mean is -m/n, so a span token gets -1 + m/n and every other token m/n.
    raw = plain[0]["token_rewards"]
    n, m = len(raw), sum(1 for r in raw if r == -1.0)
    assert m >= 2 and all(r in (0.0, -1.0) for r in raw)
    expected = [(-1.0 + m / n) if r == -1.0 else m / n for r in raw]
    assert centred[0]["token_rewards"] == pytest.approx(expected)
    assert sum(centred[0]["token_rewards"]) == pytest.approx(0.0, abs=1e-12)
    assert centred[0]["spans"] == plain[0]["spans"]
    assert set(centred[2]["token_rewards"]) == {0.0}  # critiqued, no span: stays all zero
    assert set(centred[1]["token_rewards"]) == {0.0} and centred[1]["status"] == "skipped"


def test_zero_mean_rewards_by_hand():
    from pipeline.critic.annotate import zero_mean_rewards

    assert zero_mean_rewards([0.5, 0.0, 0.0, -0.5, 0.5]) == pytest.approx([0.4, -0.1, -0.1, -0.6, 0.4])
    assert zero_mean_rewards([0.0, 0.0, 0.0]) == [0.0, 0.0, 0.0]
    assert zero_mean_rewards([]) == []


def test_zero_mean_is_a_replay_setting(tmp_path):
    from pipeline.commands.replay import effective_params

    (tmp_path / "params.yaml").write_text((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    params = effective_params(tmp_path, ["critic.zero_mean=true"])
    assert params.critic.zero_mean is True


class TruncatingClient:
    """Stands in for the client's finish_reason=length result (status "truncated"), which it passes through."""

    model = "critic-m"

    def run(self, requests, cache, progress=False):
        return [CriticResult(status="truncated", cache_key=f"k{i}", raw_text='Positive: "awf', attempts=1,
                             error="finish_reason=length") for i, _ in enumerate(requests)]


def test_truncated_answers_are_passed_through_unparsed(cache):
    out = annotate(TruncatingClient(), cache)
    critiqued = [a for a in out if a["critiqued"]]
    assert {a["status"] for a in critiqued} == {"truncated"}
    assert all(a["raw_text"] == 'Positive: "awf' and a["items"] == [] and a["spans"] == [] and a["attempts"] == 1
               and set(a["token_rewards"]) == {0.0} for a in critiqued)


def test_annotation_fields_and_the_store_schema_are_in_step():
    from pipeline.core.store import SCHEMAS

    assert SCHEMAS["annotations"].names == ["run_id", "round", *ANNOTATION_FIELDS]
