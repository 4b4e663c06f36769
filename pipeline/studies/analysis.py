"""Derived numbers of the study: seed-mean curves, steps to the sparse target, reward at matched KL.

All functions take plain lists, so the test can recompute each number independently.
"""
from __future__ import annotations

import math

NOT_MEASURES = frozenset({"round", "rollouts", "seconds", "critiqued", "kl_coef"})  # round-record bookkeeping


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def mean_std(values: list[float]) -> dict:
    """{"mean", "std", "n"}: the sample standard deviation (ddof 1), 0.0 for one value."""
    m = mean(values)
    std = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return {"mean": m, "std": std, "n": len(values)}


def seed_mean_curve(runs: list[dict], key: str) -> list[float]:
    """Per round, the mean over runs (seeds) of the round record's `key`."""
    n_rounds = len(runs[0]["rounds"])
    return [mean([run["rounds"][r][key] for run in runs]) for r in range(n_rounds)]


def sparse_target(sparse_runs: list[dict], final_window: int) -> float:
    """The sparse baseline's final reward: seed-mean env reward averaged over the last final_window rounds."""
    return mean(seed_mean_curve(sparse_runs, "env_reward")[-final_window:])


def steps_to_reach(curve: list[float], target: float) -> int | None:
    """The first round (1-based) whose value is >= target, or None if no round reaches it."""
    return next((i + 1 for i, value in enumerate(curve) if value >= target), None)


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


def matched_kl(by_arm: dict[str, list[dict]], reference_arm: str = "sparse",
               others: tuple[str, ...] = ("sparse", "sparse_scaled")) -> dict:
    """Each arm's reward-vs-KL frontier read at the KL levels the reference arm passes through.

    An arm's frontier is the isotonic fit of its seed-mean env reward on its seed-mean KL (one
    point per round); it is read by linear interpolation, never extrapolated (None outside the
    arm's KL range). Returns {"kl_levels": [...], "reward": {arm: [value or None]},
    "frontier": {arm: {"kl": [...], "reward": [...]}}, "mean_gain_vs": {other: {arm: value or None}}}
    where mean_gain_vs[other][arm] is the mean of (arm - other) over the levels where both are defined, for
    each of `others` that ran.
    """
    levels = seed_mean_curve(by_arm[reference_arm], "kl")
    frontier = {arm: dict(zip(("kl", "reward"), isotonic_frontier(seed_mean_curve(runs, "kl"),
                                                                  seed_mean_curve(runs, "env_reward"))))
                for arm, runs in by_arm.items()}
    reward = {arm: interpolate_at(f["kl"], f["reward"], levels) for arm, f in frontier.items()}
    gains: dict[str, dict] = {}
    for other in others:
        if other not in reward:
            continue
        gains[other] = {}
        for arm, values in reward.items():
            pairs = [(a, b) for a, b in zip(values, reward[other]) if a is not None and b is not None]
            gains[other][arm] = mean([a - b for a, b in pairs]) if pairs else None
    return {"kl_levels": levels, "reward": reward, "frontier": frontier, "mean_gain_vs": gains}


def headline(by_arm: dict[str, list[dict]], *, batch_size: int, final_window: int) -> dict:
    """Steps/rollouts to the sparse target, matched-KL rewards and final eval metrics (mean ± std) per arm;
    with both GRPO arms also grpo_dense against grpo_sparse at grpo_sparse's KL levels ("grpo_matched_kl")."""
    target = sparse_target(by_arm["sparse"], final_window)
    steps = {}
    for arm, runs in by_arm.items():
        reached = steps_to_reach(seed_mean_curve(runs, "env_reward"), target)
        steps[arm] = {"rounds": reached, "rollouts": None if reached is None else reached * batch_size}
    metrics = sorted({k for runs in by_arm.values() for k in runs[0]["eval"]})
    final = {arm: {m: mean_std([run["eval"][m] for run in runs]) for m in metrics} for arm, runs in by_arm.items()}
    keys = [k for k, v in by_arm["sparse"][0]["rounds"][0].items() if k not in NOT_MEASURES and isinstance(v, (int, float))]
    last = {arm: {key: mean_std([mean([r[key] for r in run["rounds"][-final_window:]]) for run in runs]) for key in keys}
            for arm, runs in by_arm.items()}
    out = {"sparse_target": target, "steps_to_target": steps, "matched_kl": matched_kl(by_arm),
           "final_eval": final, "final_rounds": last}
    if {"grpo_sparse", "grpo_dense"} <= set(by_arm):  # GRPO with and without the critic, at grpo_sparse's KL levels
        grpo = {arm: by_arm[arm] for arm in ("grpo_sparse", "grpo_dense")}
        out["grpo_matched_kl"] = matched_kl(grpo, reference_arm="grpo_sparse", others=("grpo_sparse",))
    return out
