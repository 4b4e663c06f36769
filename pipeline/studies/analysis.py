"""The statistics of every study (`drlc study`'s report, pipeline/studies/study_report.py): the one module, with the
one t quantile and the one paired interval of pipeline/. All functions take plain lists, so a test can recompute
each number independently.

- Intervals are Student's t: mean ± t(0.975, n-1) · s / √n (s the sample standard deviation, ddof 1); one seed
  has no interval (its half-width is reported as None, never as 0). A paired difference of arms A and B is the
  interval of the per-seed differences A_s − B_s over the seeds both ran: the seed-to-seed spread common to both
  arms (the prompts and first rollouts a seed draws) cancels.
- Curves: seed means per round or per episode count, the first point that reaches a target.
- Matched KL: a reward-vs-KL frontier (isotonic fit), read by interpolation, never extrapolated.
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


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def interpolate_at(xs: list[float], ys: list[float], levels: list[float]) -> list[float | None]:
    """Piecewise-linear y at each level, over the points sorted by x; None outside [min x, max x].

    Ties in x keep the order they had (a stable sort), so a vertical run of points is read at
    its first point when approached from below.
    """
    points = sorted(zip(xs, ys), key=lambda p: p[0])
    out: list[float | None] = []
    for level in levels:
        if not points or level < points[0][0] or level > points[-1][0]:
            out.append(None)
            continue
        value = points[-1][1]
        for (x0, y0), (x1, y1) in zip(points, points[1:]):
            if x0 <= level <= x1:
                value = y0 if x1 == x0 else y0 + (y1 - y0) * (level - x0) / (x1 - x0)
                break
        out.append(value)
    return out


def scale_factor(dense_all_runs: list[dict], sparse_runs: list[dict], method: str = "mean") -> float:
    """k for sparse_scaled from dense_all's and sparse's round records (every round and seed).

    method "mean": k = dense_all's mean total reward / sparse's mean env reward (total reward of a
    response = env reward x scale + the sum of its token rewards, as PPO sees it).
    method "std": k = sqrt(mean within-round variance of dense_all's total reward) / sqrt(mean
    within-round variance of sparse's env reward): the same spread of rewards between responses,
    for critics that only subtract reward (where matching the mean would give k < 1).
    """
    if method == "std":
        dense = mean([r["total_reward_std"] ** 2 for run in dense_all_runs for r in run["rounds"]])
        sparse = mean([r["env_reward_std"] ** 2 for run in sparse_runs for r in run["rounds"]])
        return math.sqrt(dense / sparse)
    dense = mean([r["total_reward"] for run in dense_all_runs for r in run["rounds"]])
    sparse = mean([r["env_reward"] for run in sparse_runs for r in run["rounds"]])
    return dense / sparse


def isotonic_frontier(xs: list[float], ys: list[float]) -> tuple[list[float], list[float]]:
    """The least-squares non-decreasing fit of y on x (pool adjacent violators), as (sorted xs, fitted ys).

    Per-round KL is a noisy one-batch estimate and not monotone in the round, so the raw
    (KL, reward) points zig-zag; the frontier reads "reward as a non-decreasing function of the
    KL spent", which is what matched-KL comparisons ask for.
    """
    points = sorted(zip(xs, ys), key=lambda p: p[0])
    blocks: list[list[float]] = []  # [sum of y, count]
    for _, y in points:
        blocks.append([y, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    fitted = [total / count for total, count in blocks for _ in range(int(count))]
    return [x for x, _ in points], fitted
