"""The statistics of every study report (`drlc study`, the real-text study): means with 95 % intervals over
seeds, differences paired by seed, and the episodes an arm needs to reach a target. The one t quantile and the
one paired interval of pipeline/.

The interval is Student's t: mean ± t(0.975, n-1) · s / √n (s the sample standard deviation, ddof 1);
one seed has no interval (its half-width is reported as None, never as 0). A paired difference of
arms A and B is the interval of the per-seed differences A_s − B_s over the seeds both ran: the
seed-to-seed spread common to both arms (the prompts and first rollouts a seed draws) cancels.
"""
from __future__ import annotations

import math

# t(0.975, df) for df = 1..10 to 4 decimals, as printed in statistics tables; above, the Cornish-Fisher series
_T975 = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706, 6: 2.4469, 7: 2.3646, 8: 2.3060, 9: 2.2622,
         10: 2.2281}


def t975(df: int) -> float:
    """The two-sided 95 % quantile of Student's t with df degrees of freedom (df >= 1): the printed table to df 10,
    then the Cornish-Fisher expansion in 1/df about the normal's z (within 1e-3 of the exact value there; scipy is
    not a drlc dependency).

    >>> t975(1), t975(4), round(t975(20), 3), round(t975(60), 3)
    (12.7062, 2.7764, 2.086, 2.0)
    """
    if df < 1:
        raise ValueError(f"t975: {df} degrees of freedom; an interval needs at least two values")
    if df in _T975:
        return _T975[df]
    z = 1.959964
    return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3))


def interval(values: list[float]) -> dict:
    """{"mean", "half", "low", "high", "n"} of values: the mean and its 95 % t interval (half None for n = 1).

    >>> round(interval([1.0, 2.0, 3.0])["half"], 4)  # s = 1, t(2) = 4.3027: 4.3027 / sqrt(3)
    2.4842
    """
    n = len(values)
    if n == 0:
        raise ValueError("interval of no values")
    m = sum(values) / n
    if n == 1:
        return {"mean": m, "half": None, "low": None, "high": None, "n": 1}
    s = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    half = t975(n - 1) * s / math.sqrt(n) if s else 0.0
    return {"mean": m, "half": half, "low": m - half, "high": m + half, "n": n}


def paired_difference(a: dict[int, float], b: dict[int, float]) -> dict:
    """The interval of a[seed] − b[seed] over the seeds in both (by seed, not by position), with those seeds.

    >>> d = paired_difference({0: 0.5, 1: 0.75, 2: 0.4}, {0: 0.25, 1: 0.5, 3: 9.0})
    >>> d["mean"], d["n"], d["seeds"]
    (0.25, 2, [0, 1])
    """
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise ValueError("paired difference: the two arms share no seed")
    return interval([a[s] - b[s] for s in seeds]) | {"seeds": seeds}


def first_reaching(points: list[tuple[int, float]], target: float) -> int | None:
    """The first x (in x order) whose y is >= target, or None when no point reaches it.

    >>> first_reaching([(2, 0.3), (0, 0.1), (4, 0.5)], 0.3), first_reaching([(1, 0.1)], 0.2)
    (2, None)
    """
    return next((x for x, y in sorted(points) if y >= target), None)


def seed_mean_points(curves: list[list[tuple[int, float]]]) -> list[tuple[int, float]]:
    """Per x that every curve has, the mean of the curves' y there (the seed-mean curve).

    >>> seed_mean_points([[(0, 0.1), (1, 0.3)], [(0, 0.3), (1, 0.5), (2, 0.9)]])
    [(0, 0.2), (1, 0.4)]
    """
    common = set.intersection(*(set(x for x, _ in c) for c in curves)) if curves else set()
    return [(x, round(sum(dict(c)[x] for c in curves) / len(curves), 12)) for x in sorted(common)]
