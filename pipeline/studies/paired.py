"""The maths of `drlc study`'s report: means with 95 % intervals over seeds, differences paired by seed,
and the episodes an arm needs to reach a target.

The interval is Student's t: mean ± t(0.975, n-1) · s / √n (s the sample standard deviation, ddof 1);
one seed has no interval (its half-width is reported as None, never as 0). A paired difference of
arms A and B is the interval of the per-seed differences A_s − B_s over the seeds both ran: the
seed-to-seed spread common to both arms (the prompts and first rollouts a seed draws) cancels.
"""
from __future__ import annotations

import math

# t(0.975, df) for df = 1..30; above 30 the normal's 1.96 is within 2 % of it
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def t975(df: int) -> float:
    """The two-sided 95 % quantile of Student's t with df degrees of freedom (df >= 1).

    >>> t975(1), t975(4), t975(100)
    (12.706, 2.776, 1.96)
    """
    if df < 1:
        raise ValueError(f"t975: {df} degrees of freedom; an interval needs at least two values")
    return _T975[df - 1] if df <= len(_T975) else 1.96


def interval(values: list[float]) -> dict:
    """{"mean", "half", "low", "high", "n"} of values: the mean and its 95 % t interval (half None for n = 1).

    >>> interval([1.0, 2.0, 3.0])["half"]  # s = 1, t(2) = 4.303: 4.303 / sqrt(3)
    2.4843
    """
    n = len(values)
    if n == 0:
        raise ValueError("interval of no values")
    m = sum(values) / n
    if n == 1:
        return {"mean": m, "half": None, "low": None, "high": None, "n": 1}
    s = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    half = round(t975(n - 1) * s / math.sqrt(n), 4) if s else 0.0
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
