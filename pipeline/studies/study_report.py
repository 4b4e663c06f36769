"""`drlc study`'s report, from the experiments alone: eval metrics per arm with 95 % intervals over seeds,
differences paired by seed at the end point and at matched KL (each arm's metric-vs-KL frontier), episodes to
reach sparse's final score, KL to the base, the critic's bill, a PNG of the eval curves and frontiers, JSON and
Markdown.

Inputs are run records (:func:`run_record`): what ``dvc exp show`` shows of one experiment (params,
metrics/eval.json) and what it holds as plots (metrics/rounds.json: the training curves;
metrics/eval_rounds.json: the held-out eval every ``evaluate.every`` rounds). Env-reward numbers are in the
task's units in every arm (the scores table's ``env_reward``, the evaluation's ``env_reward_mean``); the total
reward is what PPO read (``env_reward_shaped`` plus the critic's token rewards).
"""
from __future__ import annotations

import io
import json
import math
import subprocess
from itertools import repeat
from pathlib import Path

from pipeline.core import store
from pipeline.core.errors import DataError
from pipeline.rewards.shaping import population_std
from pipeline.studies.analysis import (
    first_reaching,
    interpolate_at,
    interval,
    isotonic_frontier,
    paired_difference,
    scale_factor,
    seed_mean_points,
)

CRITIC_ARMS = ("dense_lexicon", "dense_smol_copy", "dense_smol_text")  # another critic than the project's
GENERIC = ("env_reward_mean", "perplexity", "dist_1", "dist_2", "dist_3", "kl_to_base", "n_samples")  # not the task's own
PAIRS = (("dense", "sparse"), ("dense", "summed"), ("dense", "random"), ("dense", "sparse_scaled"),
         ("dense", "sparse_lowkl"), ("dense_scaled", "sparse_scaled"), ("sparse_scaled", "sparse"),
         ("sparse_lowkl", "sparse"), ("sparse_scaled", "sparse_lowkl"), ("dense_zero_mean", "dense"),
         ("dense_zero_mean", "sparse_scaled"), ("grpo_dense", "grpo_sparse"), ("grpo_sparse", "sparse"),
         ("random", "sparse_scaled"), ("grpo_random", "grpo_sparse"), ("grpo_dense", "grpo_random"),
         *((critic, control) for critic in CRITIC_ARMS for control in ("sparse_scaled", "random")))
CRITIC_KEYS = ("critic_requests", "cache_hits", "critic_tokens", "critic_cost_usd")
LOWER_IS_BETTER = ("expected_max_toxicity", "toxicity_probability", "perplexity", "kl_to_base")  # by metric name


def better(metric: str) -> int:
    """+1 where a larger value of `metric` is better, -1 where a smaller one is (LOWER_IS_BETTER: a toxicity)."""
    return -1 if metric.split("/")[-1] in LOWER_IS_BETTER else 1


def git_json(project: Path, rev: str, path: str) -> dict | None:
    """The JSON file `path` as committed in `rev` (None if the experiment has none)."""
    shown = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=project, capture_output=True, text=True)
    return json.loads(shown.stdout) if shown.returncode == 0 and shown.stdout.strip() else None


def final_eval(metrics: dict) -> dict[str, float]:
    """{"<set>/<metric>": value} of the trained policy in metrics/eval.json ({policy: {set: {metric}}})."""
    trained = [sets for policy, sets in metrics.items() if policy != "base"]
    return {f"{s}/{m}": v for sets in trained for s, values in sets.items()
            for m, v in values.items() if isinstance(v, (int, float)) and m != "n_samples"}


def run_record(project: Path, exp: dict, arm: str, seed: int, with_spread: bool = False) -> dict:
    """One finished experiment in the report's terms; with_spread adds each round's reward spread (read from its
    tables: :func:`response_spread`), which a scale matched by std needs."""
    params = exp["params"]
    scale = float(params["score"]["scale"])
    rounds = (git_json(project, exp["rev"], "metrics/rounds.json") or {}).get("rounds", [])
    curve = (git_json(project, exp["rev"], "metrics/eval_rounds.json") or {}).get("rounds", [])
    evaluated = final_eval(exp["metrics"].get("metrics/eval.json", {}))
    kl_end, kl_source = end_kl(evaluated, rounds)
    return {
        "arm": arm, "seed": seed, "rev": exp["rev"], "scale": scale,
        "rollouts_per_round": int(params["rollout"]["batch_size"]),
        "eval": evaluated,
        "eval_curve": curve,
        "kl_end": kl_end, "kl_source": kl_source,
        "env_reward": [r["env_reward_mean"] for r in rounds],
        "total_reward": [r["env_reward_shaped_mean"] + r["intrinsic_reward_sum"] for r in rounds],
        "critic": {key: sum(r.get(key) or 0 for r in rounds) for key in CRITIC_KEYS},
    } | ({"spread": [response_spread(project, exp["rev"], r["round"], params.get("chunks") or {})
                     for r in rounds]} if with_spread else {})


def end_kl(evaluated: dict[str, float], rounds: list[dict]) -> tuple[float | None, str | None]:
    """(KL to the base at the end, where it comes from): the final policy's kl_to_base on its first eval set
    ("eval"), or, for an experiment evaluated before drlc measured it, the last PPO round's mean KL of its
    rollouts ("ppo": the policy one update before the end, on training prompts)."""
    measured = [v for m, v in evaluated.items() if m.endswith("/kl_to_base")]
    if measured:
        return measured[0], "eval"
    return (rounds[-1]["kl"], "ppo") if rounds else (None, None)


def match_method(dense: list[dict], sparse: list[dict], method: str) -> str:
    """The match `method` stands for: "auto" is "mean" when sparse's mean env reward and dense's mean total
    reward are both positive (so a positive k matches them), else "std"; "mean" and "std" are themselves."""
    if method != "auto":
        return method
    sparse_mean = _mean([v for run in sparse for v in run["env_reward"]])
    dense_mean = _mean([v for run in dense for v in run["total_reward"]])
    return "mean" if sparse_mean > 0 and dense_mean > 0 else "std"


def choose_scale(refs_of, method: str) -> tuple[float, str]:
    """(k, the match used) for sparse_scaled; refs_of(with_spread) -> {"dense": runs, "sparse": runs}, asked for
    the spread (read from every round's tables) only when the match is std."""
    refs = refs_of(False)
    used = match_method(refs["dense"], refs["sparse"], method)
    if used == "std":
        refs = refs_of(True)
    return matched_scale(refs["dense"], refs["sparse"], used), used


def matched_scale(dense: list[dict], sparse: list[dict], method: str = "mean") -> float:
    """sparse_scaled's k over every round and seed of both arms (analysis.scale_factor): "mean" matches dense's
    mean total reward per response, "std" its spread between the responses of a round (a critic that mostly
    subtracts reward). Raises DataError when no positive k matches, naming the way out."""
    def study_runs(runs):
        return [{"rounds": [{"env_reward": e, "total_reward": t, **s} for (e, t), s in
                            zip(zip(run["env_reward"], run["total_reward"], strict=True),
                                run.get("spread") or repeat({}))]}
                for run in runs]
    sparse_mean = _mean([v for run in sparse for v in run["env_reward"]])
    try:
        k = scale_factor(study_runs(dense), study_runs(sparse), method)
    except ZeroDivisionError:
        k = float("nan")
    if not (k > 0 and math.isfinite(k)) or (method == "mean" and not sparse_mean > 0):
        dense_mean = _mean([v for run in dense for v in run["total_reward"]])
        raise DataError(f"score.scale matched by {method}: k = {k:.4g} (dense's mean total reward {dense_mean:.4g}, "
                        f"sparse's mean env reward {sparse_mean:.4g}) is no positive scale; "
                        + ("use --scale-match std, which matches the spread of rewards instead, or drop "
                           "sparse_scaled from --arms" if method == "mean" else "drop sparse_scaled from --arms"))
    return k


def response_spread(project: Path, rev: str, round_: int, chunks: dict) -> dict:
    """Within-round population std of the env reward (the task's units) and of the total reward (the shaped env
    reward + the response's token rewards, as PPO saw it), and the critic's prompt and completion tokens, from the
    round's tables in
    experiment `rev`. chunks: the experiment's params `chunks` (where a chunked run keeps each round)."""
    import dvc.api
    import pyarrow.parquet as pq

    def table(name: str) -> dict:
        path = f"data/{store.planned_partition(name, round_, chunks)}/part-0.parquet"
        with dvc.api.open(path, repo=str(project), rev=rev, mode="rb") as f:
            return {row["rollout_id"]: row for row in pq.read_table(io.BytesIO(f.read())).to_pylist()}

    scores, notes = table("scores"), table("annotations")
    env = [scores[i]["env_reward"] for i in scores]
    total = [scores[i]["env_reward_shaped"] + sum(notes[i]["token_rewards"] or []) for i in scores]
    return {"env_reward_std": population_std(env), "total_reward_std": population_std(total),
            "critic_prompt_tokens": sum(notes[i]["prompt_tokens"] or 0 for i in notes),
            "critic_completion_tokens": sum(notes[i]["completion_tokens"] or 0 for i in notes)}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def headline_metric(by_arm: dict[str, list[dict]]) -> str:
    """The task's first own eval metric in dvc exp show's (name) order (CommonGen: world/all_concepts), else the
    eval env reward."""
    names = [m for runs in by_arm.values() for run in runs for m in run["eval"]]
    own = [m for m in names if m.split("/")[-1] not in GENERIC]
    return own[0] if own else next((m for m in names if m.endswith("env_reward_mean")), names[0])


def curve_points(run: dict, metric: str) -> list[tuple[int, float]]:
    """(episodes, value) of a run's eval curve: round r is r × rollouts per round (round 0 = the base)."""
    return [(p["round"] * run["rollouts_per_round"], p[metric]) for p in run["eval_curve"] if metric in p]


def kl_key(metric: str) -> str:
    """The eval curve's KL to the base beside `metric`: the kl_to_base of the metric's prompt set."""
    return f"{metric.rsplit('/', 1)[0]}/kl_to_base"


def kl_curve(run: dict, metric: str) -> dict[int, tuple[float, float]]:
    """{round: (kl_to_base, metric)} of each evaluated round of a run (round 0, the base, at KL 0); empty for an
    experiment evaluated before drlc measured kl_to_base."""
    kl = kl_key(metric)
    return {p["round"]: (p[kl], p[metric]) for p in run["eval_curve"] if kl in p and metric in p}


def frontier(points: list[tuple[float, float]], sign: int = 1) -> tuple[list[float], list[float]] | None:
    """The metric-vs-KL frontier of (KL, metric) points: the metric's least-squares monotone fit on KL
    (analysis.isotonic_frontier: "the best metric for the KL spent"), non-decreasing for sign +1 and
    non-increasing for sign -1 (a metric where lower is better, :func:`better`); None for fewer than three points:
    the base and the end alone make a straight line, which says nothing of the path between (a run in one chunk of
    rounds is evaluated at its end only)."""
    if len(points) < 3:
        return None
    xs, fitted = isotonic_frontier([x for x, _ in points], [sign * y for _, y in points])
    return xs, [sign * y for y in fitted]


def at_matched_kl(a: dict, b: dict, metric: str) -> tuple[float, float] | None:
    """(KL, a − b) of two runs of one seed: both frontiers read at the largest KL both reached (where the run that
    drifted less ended), by linear interpolation, never extrapolated. None when either run has no frontier or
    neither left the base (that KL is not above 0)."""
    fronts = tuple(frontier(list(kl_curve(run, metric).values()), better(metric)) for run in (a, b))
    if None in fronts:
        return None
    level = min(xs[-1] for xs, _ in fronts)
    values = [interpolate_at(xs, ys, [level])[0] for xs, ys in fronts]
    if level <= 0 or None in values:
        return None
    return level, values[0] - values[1]


def matched_kl_difference(a_runs: list[dict], b_runs: list[dict], metric: str) -> dict | None:
    """The interval over seeds of the per-seed difference at matched KL (:func:`at_matched_kl`), with the seeds
    and the KL it was read at (an interval over the same seeds); None when no seed of both has frontiers."""
    others = {run["seed"]: run for run in b_runs}
    per_seed = {run["seed"]: at_matched_kl(run, others[run["seed"]], metric) for run in a_runs
                if run["seed"] in others}
    per_seed = {seed: read for seed, read in per_seed.items() if read is not None}
    if not per_seed:
        return None
    seeds = sorted(per_seed)
    return interval([per_seed[s][1] for s in seeds]) | {"seeds": seeds, "kl": interval([per_seed[s][0] for s in seeds])}


def arm_frontier(runs: list[dict], metric: str) -> dict | None:
    """An arm's frontier over seeds: per evaluated round, the seed-mean KL and metric, and their isotonic fit."""
    by_round = [kl_curve(run, metric) for run in runs]
    rounds = sorted(set.intersection(*(set(r) for r in by_round))) if by_round else []
    points = [(sum(r[n][0] for r in by_round) / len(runs), sum(r[n][1] for r in by_round) / len(runs))
              for n in rounds]
    fitted = frontier(points, better(metric))
    return None if fitted is None else {"points": points, "kl": fitted[0], "metric": fitted[1]}


def arm_summary(runs: list[dict], metric: str, target: float | None) -> dict:
    metrics = sorted({m for run in runs for m in run["eval"]})
    curve = seed_mean_points([curve_points(run, metric) for run in runs])
    kls = [run["kl_end"] for run in runs if run["kl_end"] is not None]
    return {
        "seeds": [run["seed"] for run in runs],
        "eval": {m: interval([run["eval"][m] for run in runs if m in run["eval"]]) for m in metrics},
        "kl_end": interval(kls) if kls else None,
        "kl_source": sorted({run.get("kl_source") for run in runs if run.get("kl_source")}),
        "episodes_to_target": None if target is None else first_reaching(
            [(x, better(metric) * y) for x, y in curve], better(metric) * target),
        "curve": curve,
        "frontier": arm_frontier(runs, metric),
        "critic": {key: sum(run["critic"][key] for run in runs) for key in CRITIC_KEYS},
    }


def build_report(by_arm: dict[str, list[dict]], *, metric: str | None = None, k: float | None = None,
                 settings: dict | None = None) -> dict:
    """The report's numbers (JSON-ready): per arm, paired differences, the target and its metric."""
    metric = metric or headline_metric(by_arm)
    sparse_curve = seed_mean_points([curve_points(r, metric) for r in by_arm.get("sparse", [])])
    target = sparse_curve[-1][1] if sparse_curve else None
    arms = {arm: arm_summary(runs, metric, target) for arm, runs in by_arm.items()}
    differences, matched = {}, {}
    for a, b in PAIRS:
        if a in by_arm and b in by_arm:
            matched[f"{a}-{b}"] = matched_kl_difference(by_arm[a], by_arm[b], metric)
            per_seed = [{run["seed"]: run["eval"] for run in by_arm[arm]} for arm in (a, b)]
            shared = sorted({m for ev in per_seed[0].values() for m in ev})
            differences[f"{a}-{b}"] = {m: paired_difference({s: e[m] for s, e in per_seed[0].items() if m in e},
                                                            {s: e[m] for s, e in per_seed[1].items() if m in e})
                                       for m in shared}
    return {"metric": metric, "target": target, "target_note": "sparse's seed-mean eval curve at its last point",
            "scale_k": k, "arms": arms, "differences": differences, "matched_kl": matched,
            "matched_kl_note": "per seed, both arms' metric-vs-KL frontiers (isotonic) read at the largest "
                               "kl_to_base both reached; never extrapolated",
            "settings": settings or {}}


def _ci(v: dict | None, digits: int = 3) -> str:
    if v is None:
        return "-"
    if v["half"] is None:
        return f"{v['mean']:.{digits}f} (1 seed)"
    return f"{v['mean']:.{digits}f} ± {v['half']:.{digits}f}"


def _kl_note(arms: dict) -> str:
    sources = {s for a in arms.values() for s in a.get("kl_source", [])}
    notes = {"eval": "the final policy's kl_to_base on the eval prompts",
             "ppo": "the last PPO round's mean KL of its rollouts (experiments evaluated before kl_to_base)"}
    return "; ".join(notes[s] for s in sorted(sources)) + "." if sources else "-."


def _signed(d: dict) -> str:
    return f"{d['mean']:+.3f}" + ("" if d["half"] is None else f" ± {d['half']:.3f}")


def _span(d: dict) -> str:
    return "-" if d["half"] is None else f"[{d['low']:+.3f}, {d['high']:+.3f}]"


def _matched_kl_lines(report: dict) -> list[str]:
    """The paired differences at matched KL beside the end-point ones (:func:`at_matched_kl`)."""
    rows = [(pair, d, report["differences"][pair].get(report["metric"]))
            for pair, d in (report.get("matched_kl") or {}).items()]
    if not rows:
        return []
    lines = ["", f"At matched KL ({report['metric']}; per seed, both arms' metric-vs-KL frontiers read at the largest "
             "kl_to_base both reached, never extrapolated), beside the end point:", "",
             "| difference | seeds | at KL | mean ± half | interval | end point |", "|---|---|---|---|---|---|"]
    for pair, d, end in rows:
        if d is None:
            lines.append(f"| {pair} | - | - | no eval curve with kl_to_base and a point between the base and the end "
                         f"| - | {_signed(end) if end else '-'} |")
        else:
            lines.append(f"| {pair} | {d['n']} | {_ci(d['kl'], 2)} | {_signed(d)} | {_span(d)} | "
                         f"{_signed(end) if end else '-'} |")
    return lines


def markdown(report: dict, title: str) -> str:
    """The report as Markdown: the per-arm table, the paired differences, the critic's bill, and the grid's
    experiments not finished yet (if any)."""
    metric, arms = report["metric"], report["arms"]
    shown = [metric] + sorted({m for a in arms.values() for m in a["eval"]} - {metric})
    lines = [f"## {title}", "",
             f"Eval metric: **{metric}**{' (lower is better)' if better(metric) < 0 else ''}; ± = half-width of the "
             "95 % t interval over seeds. Target = "
             + ("-" if report["target"] is None else f"{report['target']:.3f}")
             + " (sparse's seed-mean eval curve at its last point)."
             + ("" if report["scale_k"] is None else f" sparse_scaled's k = {report['scale_k']:.3f} (matched by "
                f"{report.get('scale_match', 'mean')}).")
             + " KL to base (end), nats per response: " + _kl_note(arms), "",
             "| arm | seeds | " + " | ".join(shown) + " | KL to base (end) | episodes to target |",
             "|---" * (4 + len(shown)) + "|"]
    for arm, a in arms.items():
        reached = ("-" if report["target"] is None else "not reached" if a["episodes_to_target"] is None
                   else str(a["episodes_to_target"]))  # no sparse arm (the GRPO pair's report): no target
        lines.append(f"| {arm} | {len(a['seeds'])} | " + " | ".join(_ci(a["eval"].get(m)) for m in shown)
                     + f" | {_ci(a['kl_end'])} | {reached} |")
    if report["differences"]:
        lines += ["", f"Differences paired by seed ({metric}; mean ± 95 % half-width, [low, high]):", "",
                  "| difference | seeds | mean ± half | interval |", "|---|---|---|---|"]
        for pair, by_metric in report["differences"].items():
            d = by_metric.get(metric)
            if d is not None:
                lines.append(f"| {pair} | {d['n']} | {_signed(d)} | {_span(d)} |")
        lines += _matched_kl_lines(report)
    lines += ["", "| arm | critic requests | cache hits | critic tokens | critic cost (USD) |", "|---|---|---|---|---|"]
    for arm, a in arms.items():
        c = a["critic"]
        lines.append(f"| {arm} | {c['critic_requests']} | {c['cache_hits']} | {c['critic_tokens']} | "
                     f"{c['critic_cost_usd']:.4f} |")
    if report.get("missing"):  # drlc study --report-only on a grid part-way
        lines += ["", f"Not finished, so not in this report: {', '.join(report['missing'])}."]
    return "\n".join(lines) + "\n"


def plot_curves(by_arm: dict[str, list[dict]], metric: str, path: Path, report: dict | None = None) -> Path:
    """PNG of each arm's eval curve against episodes (the seed mean and its 95 % interval band) and, beside it, its
    metric-vs-KL frontier (report["arms"][arm]["frontier"]: seed-mean points per evaluated round and their fit)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, kl_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    for arm, runs in by_arm.items():
        curves = [dict(curve_points(run, metric)) for run in runs]
        xs = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
        if not xs:
            continue
        bands = [interval([c[x] for c in curves]) for x in xs]
        line, = ax.plot(xs, [b["mean"] for b in bands], marker="o", label=f"{arm} (n={len(runs)})")
        if all(b["half"] is not None for b in bands):
            ax.fill_between(xs, [b["low"] for b in bands], [b["high"] for b in bands], alpha=0.2)
        front = ((report or {}).get("arms", {}).get(arm) or {}).get("frontier")
        if front:
            kl_ax.scatter(*zip(*front["points"]), color=line.get_color(), s=14, alpha=0.6)
            kl_ax.plot(front["kl"], front["metric"], color=line.get_color(), drawstyle="default", label=arm)
    ax.set_xlabel("episodes (rollouts trained on)")
    ax.set_ylabel(f"eval {metric}")
    kl_ax.set_xlabel(f"{kl_key(metric)} (nats per response)")
    kl_ax.set_ylabel(f"eval {metric}")
    kl_ax.set_title("frontier: seed-mean points per evaluated round, isotonic fit", fontsize=9)
    for axis in (ax, kl_ax):
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def frontier_rows(by_arm: dict[str, list[dict]], metric: str) -> list[dict]:
    """Every evaluated round of every experiment as {arm, seed, round, kl_to_base, <metric>}: the frontier panel's
    points per seed, as a table `dvc plots show` draws (docs/study.md)."""
    return [{"arm": arm, "seed": run["seed"], "round": round_, "kl_to_base": kl, metric: value}
            for arm, runs in by_arm.items() for run in runs
            for round_, (kl, value) in sorted(kl_curve(run, metric).items())]


CONTROLS = ("sparse_scaled", "sparse_lowkl")  # the scale- and KL-matched sparse controls


def best_control(report: dict, controls: tuple[str, ...] = CONTROLS) -> str | None:
    """The matched sparse control with the better seed-mean final metric (:func:`better`; None when the report has
    neither)."""
    metric = report["metric"]
    ran = [arm for arm in controls if arm in report["arms"] and metric in report["arms"][arm]["eval"]]
    return max(ran, key=lambda arm: better(metric) * report["arms"][arm]["eval"][metric]["mean"], default=None)


def point(metric: str) -> float:
    """One point of `metric`: 1 for a metric already in percent (world/positive_percent), else 0.01."""
    return 1.0 if metric.endswith("percent") else 0.01


def versus_best_control(report: dict, arm: str = "dense") -> dict:
    """`arm` against the best matched control of one grid: the paired differences at matched KL and at the end
    point, and the critic's cost per point (see `point`) of the matched-KL gain, per experiment (None without a
    gain)."""
    control = best_control(report)
    pair = f"{arm}-{control}"
    at_kl = (report.get("matched_kl") or {}).get(pair)
    end = report["differences"].get(pair, {}).get(report["metric"])
    critic, seeds = report["arms"][arm]["critic"], len(report["arms"][arm]["seeds"])
    gain = None if at_kl is None else better(report["metric"]) * at_kl["mean"]  # > 0: the arm is better
    points = None if gain is None or gain <= 0 else gain / point(report["metric"])
    return {"control": control, "at_kl": at_kl, "end": end,
            "critic_per_experiment": {key: value / seeds for key, value in critic.items()},
            "critic_per_point": None if points is None else {key: value / seeds / points
                                                             for key, value in critic.items()}}


def sweep_markdown(rows: dict[str, dict], key: str, metric: str) -> str:
    """The sweep table: per value of `key`, dense − the best matched control at matched KL and at the end point,
    and the critic's requests per experiment and per point of gain."""
    lines = [f"| {key} | best control | seeds | at KL | dense − control at matched KL | end point | "
             "critic requests / experiment | per point of gain |", "|---" * 8 + "|"]
    for value, row in rows.items():
        at_kl, end = row["at_kl"], row["end"]
        per = row["critic_per_point"]
        lines.append(f"| {value} | {row['control'] or '-'} | {at_kl['n'] if at_kl else '-'} | "
                     f"{_ci(at_kl['kl'], 2) if at_kl else '-'} | "
                     + (f"{_signed(at_kl)} {_span(at_kl)}" if at_kl else "-") + " | "
                     + (f"{_signed(end)} {_span(end)}" if end else "-") + " | "
                     f"{row['critic_per_experiment']['critic_requests']:.0f} | "
                     + ("no gain" if per is None else f"{per['critic_requests']:.3g}") + " |")
    return (f"Metric: **{metric}**; ± = 95 % half-width over paired seeds, [low, high]; a point of gain is "
            f"{point(metric):g} of it.\n\n" + "\n".join(lines) + "\n")


def plot_sweep(rows: dict[str, dict], key: str, metric: str, path: Path) -> Path:
    """PNG of dense − the best matched control against `key`: at matched KL and at the end point, 95 % bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    xs = [float(value) for value in rows]
    for name, offset, label in (("at_kl", -0.015, "at matched KL"), ("end", 0.015, "end point")):
        found = [(x, row[name]) for x, row in zip(xs, rows.values()) if row[name]]
        if found:
            ax.errorbar([x * (1 + offset) for x, _ in found], [d["mean"] for _, d in found],
                        yerr=[d["half"] or 0.0 for _, d in found], marker="o", capsize=3, label=label)
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.minorticks_off()
    ax.set_xticks(xs, [str(v) for v in rows])
    ax.set_xlabel(key)
    ax.set_ylabel(f"dense − best control\n({metric})")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
