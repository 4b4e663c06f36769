"""The fitted toxicity scorer: logistic regression on word n-grams, fit to Perspective scores of RTP rows."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from pipeline.core.config import params_from_dict
from pipeline.core.errors import ConfigError, DataError
from pipeline.evaluate.naive_bayes import features
from pipeline.rewards.fitted_toxicity import FittedToxicity, _matrix, fit_rtp, rtp_rows, spearman, split_rows
from pipeline.rewards.toxicity import LexiconToxicity
from pipeline.tasks import check_params
from pipeline.tasks.toxicity import toxicity_source

RTP = Path(__file__).resolve().parents[2] / "shared" / "data" / "toxicity" / "decodingtrust_rtp"
needs_rtp = pytest.mark.skipif(not RTP.is_dir(), reason=f"the real data is not at {RTP} (CI clones the repo next to shared/)")
ROOT = Path(__file__).resolve().parents[1]

TEXTS = ["you stupid jerk", "what a stupid idea", "thanks for the help", "a kind and helpful reply",
         "you jerk go away", "the weather is nice", "stupid stupid jerk", "have a nice day"]
TARGETS = [0.9, 0.6, 0.05, 0.02, 0.8, 0.1, 0.95, 0.03]


def test_spearman_matches_pandas_with_ties():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 5, 40).astype(float).tolist()  # many ties
    b = (np.array(a) + rng.normal(0, 2, 40)).tolist()
    # Spearman = Pearson of the average ranks; pandas' own method="spearman" imports scipy, which
    # README's test install does not bring
    expected = pd.Series(a).rank().corr(pd.Series(b).rank())
    assert spearman(a, b) == pytest.approx(expected, abs=1e-12)
    assert np.isnan(spearman([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))


def test_fit_reaches_the_optimum_of_its_objective():
    """At the fitted weights, the gradient of mean BCE + l2/2 |w|^2, computed densely here, is ~0."""
    l2 = 1e-2
    scorer = FittedToxicity.fit(TEXTS, TARGETS, l2=l2, min_count=1)
    x = _matrix([features(t) for t in TEXTS], scorer.vocab).to_dense().numpy()
    w, y = scorer.weights.numpy(), np.array(TARGETS)
    p = 1 / (1 + np.exp(-(x @ w + scorer.bias)))
    assert np.abs(x.T @ (p - y) / len(y) + l2 * w).max() < 1e-6
    assert abs((p - y).mean()) < 1e-6  # the bias's gradient
    assert scorer.toxicity(TEXTS) == pytest.approx(p.tolist(), abs=1e-12)


def test_fit_is_deterministic_ranks_toxic_text_higher_and_ignores_unknown_words():
    first, second = (FittedToxicity.fit(TEXTS, TARGETS, min_count=1) for _ in range(2))
    assert first.version == second.version and first.toxicity(TEXTS) == second.toxicity(TEXTS)
    toxic, clean, unknown = first.toxicity(["stupid jerk", "a helpful nice day", "zzz qqq"])
    assert 0 < clean < unknown < toxic < 1  # unknown words: the bias alone, between the two


def test_split_rows_is_seeded_disjoint_and_holds_out_the_share():
    rows = list(range(100))
    train, held = split_rows(rows, seed=3, heldout_share=0.2)
    assert len(held) == 20 and sorted(train + held) == rows
    assert split_rows(rows, seed=3) == (train, held) and split_rows(rows, seed=4) != (train, held)


@needs_rtp
def test_rtp_rows_read_both_parts_and_name_a_source_without_them(tmp_path):
    rows = rtp_rows(str(RTP / "toxic.jsonl"))
    assert len(rows) == 1196 and all(0 <= tox <= 1 for row in rows for _, tox in row.values())
    bad = tmp_path / "plain.jsonl"
    bad.write_text(json.dumps({"text": "no perspective scores here"}) + "\n")
    with pytest.raises(DataError, match="score.train_data.*plain.jsonl"):
        rtp_rows(str(bad))


@needs_rtp
def test_fitted_tracks_perspective_on_held_out_rows_better_than_the_lexicon():
    scorer = fit_rtp(str(RTP))
    _, held = split_rows(rtp_rows(str(RTP)), seed=0)
    lexicon = LexiconToxicity()
    for part in ("prompt", "continuation"):
        kept = [row[part] for row in held if part in row]
        truth = [y for _, y in kept]
        lexicon_rho = spearman(lexicon.toxicity([t for t, _ in kept]), truth)
        assert scorer.heldout[f"spearman_{part}"] == pytest.approx(
            spearman(scorer.toxicity([t for t, _ in kept]), truth))
        assert scorer.heldout[f"spearman_{part}"] > lexicon_rho + 0.1, (part, scorer.heldout, lexicon_rho)
    assert scorer.heldout["heldout_rows"] == 479 and scorer.heldout["train_rows"] == 1917


def _selfcritique_raw() -> dict:
    return yaml.safe_load((ROOT / "configs" / "smol-selfcritique.yaml").read_text())


def test_fitted_scorer_needs_train_data():
    raw = _selfcritique_raw()
    raw["score"]["train_data"] = None
    with pytest.raises(ConfigError, match="'score.train_data'.*decodingtrust_rtp"):
        check_params(params_from_dict(raw))


@needs_rtp
def test_the_selfcritique_profile_scores_with_the_fitted_scorer():
    raw = _selfcritique_raw()
    raw["score"]["train_data"] = str(RTP)
    source = toxicity_source(params_from_dict(raw).score)
    assert source.name == "fitted" and source.heldout["spearman_continuation"] > 0.6


def test_benchmark_roc_auc_by_hand():
    from benchmarks.toxicity_scorers import roc_auc

    # positives 0.9, 0.4; negatives 0.4, 0.1: pairs (0.9>0.4) 1, (0.9>0.1) 1, (0.4=0.4) 0.5, (0.4>0.1) 1
    assert roc_auc([0.9, 0.4, 0.4, 0.1], [1, 1, 0, 0]) == 3.5 / 4
