"""The honest reading of one task's results: sentences generated from its numbers, never hard-coded verdicts.

Every verdict compares a difference with the seed-to-seed spread it has to beat; the world
facts that could explain a small or absent dense gain come from the task's view (tasks.py).
"""
from __future__ import annotations

import math

from pipeline.studies.analysis import mean_std, seed_mean_curve
from pipeline.studies.arms import GRPO_ARMS, GROUP
from pipeline.studies.tasks import VIEWS

DENSE_ARMS = ("dense_all", "dense_selective", "dense_zero_mean")
ARM_ORDER = ("sparse", "sparse_scaled", *DENSE_ARMS, *GRPO_ARMS)  # the tables' row order


def fmt(value, digits: int = 3) -> str:
    """A number as the tables show it: fixed digits, "-" for None or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def pm(stat: dict, digits: int = 3) -> str:
    return f"{fmt(stat['mean'], digits)} ± {fmt(stat['std'], digits)}"


def _task(result: dict) -> str:
    return result.get("task", "sentiment")


def _learning(result: dict, noise: float) -> str:
    curve = seed_mean_curve(result["arms"]["sparse"]["runs"], "env_reward")
    final = result["headline"]["sparse_target"]
    gain = final - curve[0]
    verdict = ("so the budget is enough to see learning" if gain > 2 * noise else
               "barely more than the seed spread: in this budget sparse hardly learns, and speed comparisons are weak")
    return (f"- sparse moved the env reward from {fmt(curve[0])} (round 1, the base policy) to {fmt(final)} "
            f"(last {result['config']['final_window']} rounds), a gain of {fmt(gain)} against a seed std of "
            f"{fmt(noise)}: {verdict}.")


def _versus_control(result: dict, noise: float) -> list[str]:
    gains, out = result["headline"]["matched_kl"]["mean_gain_vs"], []
    scale = gains.get("sparse", {}).get("sparse_scaled")
    if scale is not None:
        out.append(f"- Reward scale alone (sparse_scaled vs sparse at matched KL): {fmt(scale)} "
                   + ("- more than the seed std." if abs(scale) > noise else "- within the seed std."))
    for arm in DENSE_ARMS:
        vs_scaled, vs_sparse = gains.get("sparse_scaled", {}).get(arm), gains.get("sparse", {}).get(arm)
        if vs_scaled is None:
            out.append(f"- {arm}: no KL level shared with sparse_scaled, so no matched-KL comparison.")
            continue
        versus = (f"vs sparse {fmt(vs_sparse)}, vs sparse_scaled {fmt(vs_scaled)} env reward at matched KL; "
                  f"seed std of sparse's final reward {fmt(noise)}")
        if vs_scaled > noise:
            out.append(f"- {arm} beats the scale-matched control at matched KL ({versus}).")
        elif vs_scaled < -noise:
            out.append(f"- **{arm} is worse than the scale-matched control at matched KL** ({versus}).")
        elif vs_sparse is not None and vs_sparse > noise:
            out.append(f"- **{arm} does not beat the scale-matched control at matched KL** ({versus}): its gain "
                       "over sparse is matched by scaling the sparse reward, i.e. it comes from reward scale "
                       "against the KL penalty, not from per-token credit.")
        else:
            out.append(f"- **{arm} does not beat sparse or the scale-matched control at matched KL beyond seed "
                       f"noise** ({versus}).")
    return out


def _eval_line(result: dict) -> str:
    key, title, digits = VIEWS[_task(result)].eval_columns[0]
    final = result["headline"]["final_eval"]
    arms = [a for a in ARM_ORDER if a in final]
    lower_is_better = "toxicity" in key
    base = [e[key] for e in result.get("base", {}).get("eval", []) if key in e]
    line = (f"- Final {title} ({'lower' if lower_is_better else 'higher'} is better"
            + (f"; base model {fmt(sum(base) / len(base), digits)}" if base else "") + "): "
            + ", ".join(f"{a} {pm(final[a][key], digits)}" for a in arms) + ".")
    means = [final[a][key]["mean"] for a in arms]
    if max(means) - min(means) < 10 ** -digits:
        return line + " The metric is saturated: every arm scores the same, so it cannot separate them."
    ordered = sorted(arms, key=lambda a: final[a][key]["mean"], reverse=not lower_is_better)
    best, runner_up = ordered[0], ordered[1]
    gap = abs(final[best][key]["mean"] - final[runner_up][key]["mean"])
    spread = final[best][key]["std"] + final[runner_up][key]["std"]
    return (line + f" Best: {best}, ahead of {runner_up} by {fmt(gap, digits)}, "
            + ("more than" if gap > spread else "within") + " the sum of their seed stds.")


def _eval_agreement(result: dict, noise: float) -> list[str]:
    """Whether the held-out eval agrees with each matched-KL win over the scale-matched control."""
    key, title, digits = VIEWS[_task(result)].eval_columns[0]
    final, gains = result["headline"]["final_eval"], result["headline"]["matched_kl"]["mean_gain_vs"]
    sign = -1.0 if "toxicity" in key else 1.0
    out = []
    for arm in DENSE_ARMS:
        if (gains.get("sparse_scaled", {}).get(arm) or 0.0) <= noise:
            continue
        worse = [c for c in ("sparse", "sparse_scaled") if sign * (final[arm][key]["mean"] - final[c][key]["mean"])
                 < -(final[arm][key]["std"] + final[c][key]["std"])]
        better = [c for c in ("sparse", "sparse_scaled") if sign * (final[arm][key]["mean"] - final[c][key]["mean"])
                  > final[arm][key]["std"] + final[c][key]["std"]]
        if worse:
            verdict = f"its held-out {title} is worse than {' and '.join(worse)}'s beyond seed spread"
        elif len(better) == 2:
            verdict = f"its held-out {title} confirms it (better than both sparse arms beyond seed spread)"
        else:
            verdict = f"its held-out {title} does not confirm it (within seed spread of a sparse arm)"
        out.append(f"- {arm}'s matched-KL win on training rollouts: {verdict}.")
    return out


def _grpo(result: dict) -> list[str]:
    """GRPO with the critic against GRPO without it (at grpo_sparse's KL levels), and GRPO against PPO."""
    h = result["headline"]
    if "grpo_matched_kl" not in h:
        return []
    noise = h["final_rounds"]["grpo_sparse"]["env_reward"]["std"]
    gain = h["grpo_matched_kl"]["mean_gain_vs"]["grpo_sparse"]["grpo_dense"]
    ppo_gains = h["matched_kl"]["mean_gain_vs"].get("sparse", {})
    kl = {arm: h["final_rounds"][arm]["kl"] for arm in ("sparse", *GRPO_ARMS)}
    prompts = result["config"]["batch_size"] // GROUP
    if gain is None:
        verdict = "no KL level shared, so no matched-KL comparison"
    elif gain > noise:
        verdict = "grpo_dense beats grpo_sparse at matched KL"
    elif gain < -noise:
        verdict = "**grpo_dense is worse than grpo_sparse at matched KL**"
    else:
        verdict = "**grpo_dense does not beat grpo_sparse at matched KL beyond seed noise**"
    final = h["final_rounds"]["grpo_sparse"]["env_reward"]["mean"]
    ceiling = (f"grpo_sparse already ends at {fmt(final)} of a reward bounded by 1, so little is left for the critic "
               "to add, and a seed std that small makes any difference look large; " if final >= 0.95 else "")
    return [f"- GRPO ({GROUP} responses to each of {prompts} prompts a round, no value head): {verdict} "
            f"(grpo_dense − grpo_sparse {fmt(gain)} env reward at grpo_sparse's KL levels; seed std of grpo_sparse's "
            f"final reward {fmt(noise)}).",
            f"- GRPO against PPO at the sparse arm's KL levels: grpo_sparse {fmt(ppo_gains.get('grpo_sparse'))}, "
            f"grpo_dense {fmt(ppo_gains.get('grpo_dense'))} env reward vs sparse; final KL " + ", ".join(
                f"{arm} {fmt(kl[arm]['mean'], 2)} ± {fmt(kl[arm]['std'], 2)}" for arm in kl) + ".",
            f"- What could limit a dense gain under GRPO here: {ceiling}the dense term has one untuned weight "
            "(ppo.dense_weight 1: as large as the group advantage), and the GRPO arms control KL by a fixed β = 0.04 "
            "loss term where the PPO arms use an adaptive penalty in the reward, so GRPO and PPO arms differ in KL "
            "control as well as in the advantage (compare them at matched KL, not at the final round)."]


def _mechanism(result: dict) -> list[str]:
    """How fast each arm removes what the critic's spans penalise: the all-rounds mean of that measure per arm."""
    key = VIEWS[_task(result)].critic_target
    runs = {arm: result["arms"][arm]["runs"] for arm in ("sparse", "sparse_scaled", "dense_all") if arm in result["arms"]}
    if not key or key not in runs["sparse"][0]["rounds"][0]:
        return []
    per_seed = {arm: [sum(r[key] for r in run["rounds"]) / len(run["rounds"]) for run in arm_runs]
                for arm, arm_runs in runs.items()}
    stats = {arm: mean_std(values) for arm, values in per_seed.items()}
    control = "sparse_scaled" if "sparse_scaled" in stats else "sparse"
    gap = stats[control]["mean"] - stats["dense_all"]["mean"]
    verdict = ("dense_all removes it faster, beyond seed spread" if gap > stats[control]["std"] + stats["dense_all"]["std"]
               else "no difference beyond seed spread")
    return [f"- Mechanism check ({key}, what the critic's spans penalise, mean over all rounds): "
            + ", ".join(f"{arm} {fmt(s['mean'])} ± {fmt(s['std'])}" for arm, s in stats.items()) + f": {verdict}."]


def _hacking(result: dict, dense: str = "dense_all", control: str | None = None) -> str:
    rounds = result["headline"]["final_rounds"]
    control = control or ("sparse_scaled" if "sparse_scaled" in rounds else "sparse")
    d, c = rounds[dense], rounds[control]
    parts = []
    for key in VIEWS[_task(result)].hacking:
        if key not in d:
            continue
        beyond = abs(d[key]["mean"] - c[key]["mean"]) > d[key]["std"] + c[key]["std"]
        parts.append(f"{key} {fmt(d[key]['mean'])} vs {fmt(c[key]['mean'])}" + (" (beyond seed spread)" if beyond else ""))
    return (f"- Degradation check (last {result['config']['final_window']} rounds, {dense} vs {control}): "
            + "; ".join(parts) + ".")


def honest_reading(result: dict) -> list[str]:
    """Sentences derived from one task's numbers: where dense wins, where it does not, and what could be why."""
    h = result["headline"]
    noise = h["final_rounds"]["sparse"]["env_reward"]["std"]  # seed-to-seed spread of sparse's final reward
    out = [_learning(result, noise), *_versus_control(result, noise), *_grpo(result)]
    steps = h["steps_to_target"]
    arms = [a for a in ARM_ORDER if a in steps]
    out.append(f"- Rounds to the sparse target ({fmt(h['sparse_target'])}): "
               + ", ".join(f"{a} {steps[a]['rounds'] if steps[a]['rounds'] is not None else 'never'}" for a in arms)
               + f" (of {result['config']['rounds']}).")
    k = result["scale_factor"]
    other = {"mean": "k_std", "std": "k_mean"}.get(k.get("match", "mean"))
    alt = f"; matching the other way would give {fmt(k[other])}" if k.get(other) is not None else ""
    out.append(f"- Scale factor k = {fmt(k['k'])} (matched by {k.get('match', 'mean')}: dense_all mean total reward "
               f"{fmt(k['dense_all_mean_total_reward'])}, sparse mean env reward {fmt(k['sparse_mean_env_reward'])}"
               f"{alt}); sparse_scaled reached a mean total reward of {fmt(k['sparse_scaled_mean_total_reward'])}.")
    out += [*_mechanism(result), _eval_line(result), *_eval_agreement(result, noise), _hacking(result)]
    if "grpo_matched_kl" in h:
        out.append(_hacking(result, "grpo_dense", "grpo_sparse"))
    out.append("- What in the world, the critic or the settings could limit or inflate a dense gain here: "
               + VIEWS[_task(result)].caveat + " Seeds are few (see the ± columns): differences smaller than the std "
               "are not evidence. The ablation is one seed of off-policy replay: read it for direction only.")
    return out
