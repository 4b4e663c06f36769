"""drlc's own ROUGE (pipeline/rewards/summarization.py) against Google's rouge_score package on real TL;DR pairs.

The pairs are read at test time from ../shared/data/summarization/tldr_oai_ppo1b/oai1b.csv (1,945 Reddit posts,
their human TL;DR and a PPO-1.3B summary; shared/data/SOURCES.md), never copied into the repo. rouge_score runs
with use_stemmer=False, the setting drlc reproduces (lower-case, runs of non-[a-z0-9] separate tokens, no
stemming); ROUGE-L is rouge_score's sentence-level "rougeL", not "rougeLsum".
"""
import csv
import sys
from pathlib import Path

import pytest
from rouge_score import rouge_scorer

from pipeline.rewards.summarization import RougeReward, rouge_l, rouge_n

TLDR = Path(__file__).resolve().parents[2] / "shared" / "data" / "summarization" / "tldr_oai_ppo1b" / "oai1b.csv"
pytestmark = pytest.mark.skipif(not TLDR.is_file(), reason=f"the TL;DR pairs are not at {TLDR} (shared/data sits "
                                                           f"next to the checkout only on dev/CI machines)")
TOL = 1e-9  # observed: 0.0, the same float operations in the same order


def tldr_rows() -> list[dict]:
    csv.field_size_limit(sys.maxsize)  # posts are longer than csv's default field limit
    with TLDR.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def ours(candidate: str, reference: str) -> dict[str, float]:
    return {"rouge1": rouge_n(candidate, reference, 1), "rouge2": rouge_n(candidate, reference, 2),
            "rougeL": rouge_l(candidate, reference)}


def theirs(scorer, candidate: str, reference: str) -> dict[str, float]:
    return {key: score.fmeasure for key, score in scorer.score(reference, candidate).items()}  # (target, prediction)


def test_rouge_1_2_l_equal_rouge_score_on_tldr_pairs():
    rows = tldr_rows()
    assert len(rows) == 1945  # as in shared/data/SOURCES.md
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=False)
    # every PPO summary against its human TL;DR, plus 100 whole posts (hundreds of tokens: a long LCS table)
    pairs = [(r["postprocessed_response"], r["reference_responses"]) for r in rows]
    pairs += [(r["query"], r["reference_responses"]) for r in rows[:100]]
    worst = {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    for candidate, reference in pairs:
        a, b = ours(candidate, reference), theirs(scorer, candidate, reference)
        for key in worst:
            worst[key] = max(worst[key], abs(a[key] - b[key]))
    assert max(worst.values()) <= TOL, worst
    summaries = [c for c, _ in pairs[:len(rows)]]
    references = [r for _, r in pairs[:len(rows)]]
    expected = [100 * theirs(scorer, c, r)["rouge1"] for c, r in zip(summaries, references)]
    assert RougeReward().score(summaries, references=references) == pytest.approx(expected, abs=100 * TOL)


def test_stemming_is_the_setting_drlc_leaves_out():
    # rouge_score's use_stemmer=True (Porter, tokens over 3 letters) changes many of the same pairs' scores:
    # drlc's numbers are the unstemmed ones (pipeline/rewards/summarization.py says so)
    scorer = rouge_scorer.RougeScorer(["rouge1"], use_stemmer=True)
    rows = tldr_rows()[:200]
    changed = sum(abs(ours(r["postprocessed_response"], r["reference_responses"])["rouge1"]
                      - theirs(scorer, r["postprocessed_response"], r["reference_responses"])["rouge1"]) > TOL
                  for r in rows)
    assert changed > 20
