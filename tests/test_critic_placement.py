"""critic.placement: the same cached answers put on their tokens, summed on the last token, or at random words.

Real template, real BPE tokenizer, the lexicon critic behind drlc's local server (as tests/test_critic_annotate.py).
"""
import pytest
from test_critic_annotate import FAST, REWARDS, TEMPLATE, rows, tokenizer

from pipeline.critic.annotate import annotate_round, placed_rewards, summed_rewards
from pipeline.critic.client import CriticClient
from pipeline.critic.offline.random_spans import words
from pipeline.critic.offline.server import serve_in_background


def annotate(client, cache, placement):
    return annotate_round(rows(), template=TEMPLATE, tokenizer=tokenizer(), client=client, cache=cache,
                          threshold=0.0, rewards=REWARDS, alignment="exact", progress=False, placement=placement)


def test_summed_rewards_by_hand():
    assert summed_rewards([0.5, 0.0, -1.0, 0.0]) == [0.0, 0.0, 0.0, -0.5]
    assert summed_rewards([0.0]) == [0.0] and summed_rewards([]) == []


def test_placements_share_the_cached_answers_and_keep_or_move_the_reward(cache):
    with serve_in_background(backend="lexicon") as (url, stats):
        client = CriticClient(base_url=url, **FAST)
        tokens, summed, moved = (annotate(client, cache, p) for p in ("tokens", "summed", "random"))
        assert stats()["requests"] == 3  # placement is applied after the cache: no new request for the 2nd and 3rd
    assert [a["cache_key"] for a in summed] == [a["cache_key"] for a in tokens] == [a["cache_key"] for a in moved]
    first = tokens[0]["token_rewards"]  # "The movie was awful and boring.": awful, boring at -1 each
    n = len(first)
    # summed: by hand, the two -1 spans' tokens summed (-1 per token they cover) onto the last token
    assert summed[0]["token_rewards"] == [0.0] * (n - 1) + [pytest.approx(sum(first))]
    assert sum(first) <= -2.0 and summed[0]["spans"] == tokens[0]["spans"]
    # random: as many spans, same labels and word lengths, at whole words of the same response
    text = rows()[0]["response"]
    kept, placed = tokens[0]["spans"], moved[0]["spans"]
    assert [s["label"] for s in placed] == [s["label"] for s in kept]
    word_set = {text[s:e] for s, e in words(text)}
    assert all(s["text"] in word_set for s in placed)  # one-word spans land on one whole word each
    assert len(moved[0]["token_rewards"]) == n and all(r in (0.0, -1.0) for r in moved[0]["token_rewards"])
    assert moved[0]["token_rewards"].count(-1.0) >= 2
    assert [a["status"] for a in moved] == [a["status"] for a in tokens]
    again = annotate_round(rows(), template=TEMPLATE, tokenizer=tokenizer(), client=client, cache=cache,
                           threshold=0.0, rewards=REWARDS, alignment="exact", progress=False, placement="random")
    assert [a["token_rewards"] for a in again] == [a["token_rewards"] for a in moved]  # seeded by the response


def test_random_placement_moves_overlapping_spans_once():
    row = rows()[0]
    text = row["response"]
    start = text.index("awful")
    spans = [{"label": "negative", "start": start, "end": start + 5},
             {"label": "negative", "start": start, "end": start + 9}]  # "awful", "awful and": overlap
    moved, rewards = placed_rewards(row, spans, [0.0] * len(row["response_ids"]), placement="random",
                                    tokenizer=tokenizer(), rewards=REWARDS)
    assert len(moved) == 1 and moved[0]["text"] in {text[s:e] for s, e in words(text)}
