"""pipeline/studies/analysis.py's curve statistics against hand numbers and independent numpy computations."""
import math

import numpy as np
import pytest

from pipeline.studies.analysis import (
    interpolate_at,
    isotonic_frontier,
    matched_kl,
    scale_factor,
    seed_mean_curve,
    sparse_target,
    steps_to_reach,
)


def _isotonic_by_minmax(y):
    """Isotonic regression by its min-max formula: fit_i = max_{j<=i} min_{k>=i} mean(y[j..k])."""
    n = len(y)
    return np.array([max(min(np.mean(y[j:k + 1]) for k in range(i, n)) for j in range(i + 1)) for i in range(n)])


def _runs(rng, n_seeds=3, n_rounds=6, drift=0.1):
    """Round records of a few seeds: a noisy rising reward and a noisy rising KL."""
    return [{"rounds": [{"env_reward": 0.2 + drift * r + rng.normal(0, 0.05), "kl": 0.5 * r + rng.normal(0, 0.4),
                         "total_reward": 0.3 + drift * r + rng.normal(0, 0.05),
                         "env_reward_std": abs(rng.normal(0.2, 0.05)), "total_reward_std": abs(rng.normal(0.3, 0.05))}
                        for r in range(n_rounds)]} for _ in range(n_seeds)]


def _seed_mean(runs, key):
    return np.array([[r[key] for r in run["rounds"]] for run in runs]).mean(axis=0)


def test_isotonic_frontier_by_hand():
    xs, fitted = isotonic_frontier([3.0, 1.0, 2.0, 4.0], [0.2, 0.5, 0.1, 0.9])
    assert xs == [1.0, 2.0, 3.0, 4.0]
    assert fitted == pytest.approx([0.8 / 3, 0.8 / 3, 0.8 / 3, 0.9])


def test_interpolation_and_steps_by_hand():
    assert interpolate_at([0.0, 2.0, 1.0], [0.0, 4.0, 1.0], [0.5, 1.5, 2.0, 2.5, -1.0]) == [0.5, 2.5, 4.0, None, None]
    assert steps_to_reach([0.1, 0.3, 0.2, 0.5], 0.25) == 2
    assert steps_to_reach([0.1, 0.2], 0.25) is None


def test_the_sparse_target_is_the_seed_mean_of_the_last_rounds():
    runs = _runs(np.random.default_rng(1))
    assert sparse_target(runs, 3) == pytest.approx(_seed_mean(runs, "env_reward")[-3:].mean(), rel=1e-12)
    assert seed_mean_curve(runs, "kl") == pytest.approx(_seed_mean(runs, "kl").tolist(), rel=1e-12)


def test_scale_factor_matches_an_independent_computation():
    rng = np.random.default_rng(2)
    dense, sparse = _runs(rng), _runs(rng)
    flat = lambda runs, key: np.array([r[key] for run in runs for r in run["rounds"]])  # noqa: E731
    by_mean = flat(dense, "total_reward").mean() / flat(sparse, "env_reward").mean()
    by_std = math.sqrt(np.mean(flat(dense, "total_reward_std") ** 2) / np.mean(flat(sparse, "env_reward_std") ** 2))
    assert scale_factor(dense, sparse, "mean") == pytest.approx(by_mean, rel=1e-12)
    assert scale_factor(dense, sparse, "std") == pytest.approx(by_std, rel=1e-12)


def test_matched_kl_matches_an_independent_frontier():
    rng = np.random.default_rng(3)
    by_arm = {"sparse": _runs(rng), "sparse_scaled": _runs(rng, drift=0.12), "dense": _runs(rng, drift=0.15)}
    matched = matched_kl(by_arm)
    levels = _seed_mean(by_arm["sparse"], "kl")
    assert matched["kl_levels"] == pytest.approx(levels.tolist())
    expected = {}
    for arm, runs in by_arm.items():
        kl, reward = _seed_mean(runs, "kl"), _seed_mean(runs, "env_reward")
        order = np.argsort(kl, kind="stable")
        fitted = _isotonic_by_minmax(reward[order])
        np.testing.assert_allclose(matched["frontier"][arm]["reward"], fitted, rtol=1e-9, atol=1e-12)
        inside = (levels >= kl.min()) & (levels <= kl.max())
        expected[arm] = np.where(inside, np.interp(levels, kl[order], fitted), np.nan)
        got = np.array([np.nan if v is None else v for v in matched["reward"][arm]])
        np.testing.assert_allclose(got, expected[arm], rtol=1e-9, atol=1e-12)
    for other in ("sparse", "sparse_scaled"):
        for arm in by_arm:
            both = ~np.isnan(expected[arm]) & ~np.isnan(expected[other])
            gain = matched["mean_gain_vs"][other][arm]
            assert gain == pytest.approx(float(np.mean(expected[arm][both] - expected[other][both])), abs=1e-12)
