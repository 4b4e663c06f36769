"""pipeline/studies/analysis.py's curve statistics against hand numbers and independent numpy computations."""
import math

import numpy as np
import pytest

from pipeline.studies.analysis import interpolate_at, isotonic_frontier, scale_factor


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


def test_isotonic_frontier_by_hand():
    xs, fitted = isotonic_frontier([3.0, 1.0, 2.0, 4.0], [0.2, 0.5, 0.1, 0.9])
    assert xs == [1.0, 2.0, 3.0, 4.0]
    assert fitted == pytest.approx([0.8 / 3, 0.8 / 3, 0.8 / 3, 0.9])


def test_isotonic_frontier_matches_the_min_max_formula():
    rng = np.random.default_rng(3)
    xs, ys = rng.uniform(0, 2, 12), rng.normal(0, 1, 12)
    order = np.argsort(xs, kind="stable")
    sorted_xs, fitted = isotonic_frontier(xs.tolist(), ys.tolist())
    assert sorted_xs == pytest.approx(xs[order].tolist())
    assert fitted == pytest.approx(_isotonic_by_minmax(ys[order]).tolist(), rel=1e-12)


def test_interpolation_by_hand():
    assert interpolate_at([0.0, 2.0, 1.0], [0.0, 4.0, 1.0], [0.5, 1.5, 2.0, 2.5, -1.0]) == [0.5, 2.5, 4.0, None, None]


def test_scale_factor_matches_an_independent_computation():
    rng = np.random.default_rng(2)
    dense, sparse = _runs(rng), _runs(rng)
    flat = lambda runs, key: np.array([r[key] for run in runs for r in run["rounds"]])  # noqa: E731
    by_mean = flat(dense, "total_reward").mean() / flat(sparse, "env_reward").mean()
    by_std = math.sqrt(np.mean(flat(dense, "total_reward_std") ** 2) / np.mean(flat(sparse, "env_reward_std") ** 2))
    assert scale_factor(dense, sparse, "mean") == pytest.approx(by_mean, rel=1e-12)
    assert scale_factor(dense, sparse, "std") == pytest.approx(by_std, rel=1e-12)
