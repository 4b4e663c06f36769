"""Voting over critic.samples answers: characters marked by at least critic.vote_min answers, worked by hand."""

import json
from functools import lru_cache
from pathlib import Path

import pytest
from conftest import train_bpe

from pipeline.core.errors import ConfigError
from pipeline.critic.annotate import ANNOTATION_FIELDS, annotate_round
from pipeline.critic.client import CriticResult, RunStats
from pipeline.critic.templates import load_template
from pipeline.critic.vote import majority, vote_spans

TEMPLATE = load_template(Path(__file__).resolve().parents[1] / "prompts" / "toxicity.md")
RESPONSE = "you are a total idiot and a fool"
#           0123456789012345678901234567890 1
ANSWERS = ['Toxic: "total idiot"', 'Toxic: "idiot"; "fool"', 'Toxic: "a total idiot"']


@lru_cache(maxsize=1)
def tokenizer():
    return train_bpe([RESPONSE] * 5, vocab_size=280)


class ThreeCritics:
    """A stand-in client whose answer depends on the sample index (as a sampling critic's would)."""

    model = "stand-in"

    def __init__(self, answers=ANSWERS):
        self.answers, self.calls, self.last_stats = answers, [], RunStats()

    def run(self, requests, cache, *, sample_index=0, progress=False, bodies=None):
        self.calls.append((sample_index, bodies))
        self.last_stats = RunStats(requests_sent=len(requests), cost_usd=0.5)
        return [CriticResult(status="ok", cache_key=f"key{sample_index}", raw_text=self.answers[sample_index])
                for _ in requests]


def annotate(vote_min, samples=3, answers=ANSWERS):
    client = ThreeCritics(answers)
    row = {"rollout_id": "r0", "response": RESPONSE, "response_ids": tokenizer().encode(RESPONSE), "env_reward": 0.0}
    out = annotate_round([row], template=TEMPLATE, tokenizer=tokenizer(), client=client, cache=None, threshold=0.5,
                         rewards={"toxic": -1.0}, alignment="exact", progress=False, samples=samples,
                         vote_min=vote_min)
    return out[0], client


@pytest.mark.parametrize("vote_min, expected", [
    (1, [(8, 21), (28, 32)]),  # any answer: "a total idiot", "fool"
    (2, [(10, 21)]),  # answers 0 and 2 share "total idiot"
    (None, [(10, 21)]),  # null = a majority of 3 = 2
    (3, [(16, 21)]),  # all three mark only "idiot"
])
def test_three_answers_voted_by_hand(vote_min, expected):
    row, client = annotate(vote_min)
    assert tuple(row) == ANNOTATION_FIELDS and row["status"] == "ok"
    assert [(s["start"], s["end"]) for s in row["spans"]] == expected
    assert [RESPONSE[s["start"]:s["end"]] for s in row["spans"]] == [RESPONSE[a:b] for a, b in expected]
    assert json.loads(row["raw_text"]) == ANSWERS and row["cache_key"] == "key0,key1,key2"
    assert [index for index, _ in client.calls] == [0, 1, 2]  # each sample is its own request (and cache entry)
    assert [bodies[0]["seed"] for _, bodies in client.calls] == [0, 1, 2]
    assert client.last_stats.requests_sent == 3 and client.last_stats.cost_usd == 1.5  # summed over samples
    ids = tokenizer().encode(RESPONSE)
    offsets = tokenizer()(RESPONSE, return_offsets_mapping=True)["offset_mapping"]
    rewarded = [any(a < e and s < b for a, b in expected) for s, e in offsets]
    assert [r < 0 for r in row["token_rewards"]] == rewarded and len(row["token_rewards"]) == len(ids)


def test_vote_spans_counts_an_answer_once_per_character():
    assert vote_spans([[("toxic", 0, 4), ("toxic", 2, 6)], []], vote_min=2) == []
    assert vote_spans([[("a", 0, 2)], [("b", 0, 2)]], vote_min=1) == [("a", 0, 2), ("b", 0, 2)]
    assert majority(1) == 1 and majority(3) == 2 and majority(4) == 3 and majority(5) == 3
    with pytest.raises(ConfigError, match="critic.vote_min 4 must be in 1..3"):
        vote_spans([[], [], []], vote_min=4)


def test_no_character_reaching_the_vote_is_none_with_a_reason():
    row, _ = annotate(vote_min=2, samples=2, answers=['Toxic: "total"', 'Toxic: "fool"'])  # no shared character
    assert row["status"] == "none" and "critic.vote_min" in row["error"] and row["spans"] == []
    assert all(r == 0.0 for r in row["token_rewards"])
