"""The real-text study's report (issue 30): RL gain over the scale-matched control against critic quality.

Inputs are the DVC study's run records (benchmarks/sample_efficiency_dvc.py: per arm, one record per
seed with ``rounds`` [env_reward, kl, critic tokens ...], ``eval`` {"<set>/<metric>": value} of the
final policy and ``samples``) and each critic's char F1 on the SemEval trial posts. Every number is
a plain function of those lists, so the tests recompute them by hand.

- **Control:** each arm is measured against :func:`critics.control`: ``sparse_scaled`` under PPO, the
  plain sparse arm of the same algorithm under a value-free one (``sparse-grpo``), whose group
  normalisation cancels any scale. Rollouts-to-target use the same algorithm's sparse arm.
- **Matched KL:** :func:`analysis.matched_kl` (each arm's isotonic reward-vs-KL frontier read at the KL
  levels of its algorithm's sparse arm), its mean gain over the control.
- **Paired intervals:** arm minus control per seed (the same seed = the same prompts and the same
  base sampling in round 1), mean ± t(0.975, n-1) · sd / sqrt(n); undefined (None) for one seed.
- **Critic cost:** the tokens the critic read and wrote, priced at an API's per-1M-token prices (what
  the arm would have cost with that critic), beside the dollars actually paid (0 from drlc's
  local critics, and 0 for every answer read from the cache).
"""
from __future__ import annotations

from pathlib import Path

from pipeline.core.errors import DataError
from pipeline.studies import critics
from pipeline.studies.analysis import (
    matched_kl,
    mean,
    paired_difference,
    seed_mean_curve,
    sparse_target,
    steps_to_reach,
)

EVAL_METRICS = ("expected_max_toxicity", "toxicity_probability", "perplexity", "dist_1", "dist_2", "dist_3",
                "env_reward_mean")
API_PRICE = ("gpt-3.5-turbo", 0.5, 1.5)  # the paper's critic; USD per 1M prompt and per 1M completion tokens


def paired_interval(arm: dict[int, float], control: dict[int, float]) -> dict:
    """Mean of (arm - control) over the seeds both have, with its 95 % t interval (paired.paired_difference).

    :param arm: {seed: value}
    :param control: {seed: value}
    :return: {"mean", "half", "low", "high", "n", "seeds"}; half, low, high None with one paired seed; mean None too
        with none
    """
    if not set(arm) & set(control):
        return {"mean": None, "half": None, "low": None, "high": None, "n": 0, "seeds": []}
    return paired_difference(arm, control)


def by_seed(runs: list[dict], value) -> dict[int, float]:
    """{seed: value(run)} over an arm's runs, skipping runs where value is None."""
    out = {run["seed"]: value(run) for run in runs}
    return {s: v for s, v in out.items() if v is not None}


def final_reward(run: dict, window: int) -> float:
    return mean([r["env_reward"] for r in run["rounds"][-window:]])


def api_cost(runs: list[dict], price: tuple[str, float, float] = API_PRICE) -> dict:
    """An arm's critic tokens (summed over seeds and rounds) at an API's prices, and what it paid.

    Local backends count words (lexicon, tagger, random_spans) or their tokenizer's tokens (hf):
    the API figure is an estimate of the same traffic at ``price``.
    """
    rounds = [r for run in runs for r in run["rounds"]]
    prompt = sum(r.get("critic_prompt_tokens", 0) for r in rounds)
    completion = sum(r.get("critic_completion_tokens", 0) for r in rounds)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "api_model": price[0],
            "at_api_prices_usd": (prompt * price[1] + completion * price[2]) / 1e6,
            "paid_usd": sum(r["critic_cost_usd"] for r in rounds),
            "requests": sum(r["critic_requests"] for r in rounds), "cache_hits": sum(r["cache_hits"] for r in rounds)}


def by_algorithm(by_arm: dict[str, list[dict]]) -> dict[str, dict[str, list[dict]]]:
    """{algorithm: {arm: runs}}: the arms each algorithm's controls are compared with."""
    out: dict[str, dict[str, list[dict]]] = {}
    for arm, runs in by_arm.items():
        out.setdefault(critics.split_name(arm)[1], {})[arm] = runs
    return out


def eval_intervals(runs: list[dict], other: list[dict]) -> dict[str, dict]:
    """Per held-out eval metric ("<set>/<metric>" of EVAL_METRICS): runs minus other, paired by seed."""
    keys = sorted({k for run in runs for k in run["eval"] if k.split("/")[-1] in EVAL_METRICS})
    return {key: paired_interval(by_seed(runs, lambda r: r["eval"].get(key)),
                                 by_seed(other, lambda r: r["eval"].get(key))) for key in keys}


def arm_rows(by_arm: dict[str, list[dict]], quality: dict[str, dict], *, final_window: int,
             batch_size: int) -> dict[str, dict]:
    """Per arm: critic char F1, rollouts to its algorithm's sparse final reward, matched-KL gain and paired
    intervals vs its control (:func:`critics.control`); for a real critic's dense arm also ``vs_random``, the
    paired intervals against the same algorithm's random-span arm (the right tokens, or any dense signal?).

    :param quality: {critic name: {"char_f1", ...}} for the dense arms' critics (``dense_<critic>[-algo]``)
    :param batch_size: rollouts per round (rollout.batch_size)
    """
    def final(arm_runs):
        return by_seed(arm_runs, lambda r: final_reward(r, final_window))

    rows = {}
    for algorithm, arms in by_algorithm(by_arm).items():
        sparse = critics.arm_name("sparse", algorithm)
        if sparse not in arms:
            raise DataError(f"the {algorithm} arms {list(arms)} are measured against {sparse}, which is not among "
                            f"the runs: run it (sample_efficiency_dvc.py --critics ... --algorithms {algorithm})")
        target = sparse_target(arms[sparse], final_window)
        gains = matched_kl(arms, reference_arm=sparse, others=(sparse, critics.control(sparse)))["mean_gain_vs"]
        for arm, runs in arms.items():
            control = critics.control(arm)
            critic = arm.split("-")[0].removeprefix("dense_") if arm.startswith("dense_") else None
            reached = steps_to_reach(seed_mean_curve(runs, "env_reward"), target)
            row = {"critic": critic, "char_f1": (quality.get(critic) or {}).get("char_f1") if critic else None,
                   "algorithm": algorithm, "control": control, "seeds": sorted(run["seed"] for run in runs),
                   "rollouts_to_sparse_final": None if reached is None else reached * batch_size,
                   "gain_at_matched_kl": gains.get(control, {}).get(arm),
                   "gain_at_matched_kl_vs_sparse": gains.get(sparse, {}).get(arm),
                   "final_env_reward_vs_control": paired_interval(final(runs), final(by_arm.get(control, []))),
                   "eval_vs_control": eval_intervals(runs, by_arm.get(control, [])), "critic_cost": api_cost(runs)}
            random = critics.arm_name(critics.RANDOM_CONTROL, algorithm)
            if critic not in (None, "random") and random in by_arm:  # the right tokens, or any dense signal?
                row["vs_random"] = {"arm": random, "eval": eval_intervals(runs, by_arm[random]),
                                    "final_env_reward": paired_interval(final(runs), final(by_arm[random]))}
            rows[arm] = row
    return rows


def plot_gain_vs_f1(rows: dict[str, dict], path: Path) -> Path:
    """The headline picture: each dense arm's reward gain over its control against its critic's char F1.

    y = the paired final-reward gain with its 95 % interval (bars, where there are 2+ seeds); a hollow
    marker at the matched-KL gain. Circles: PPO (vs sparse_scaled); squares: a value-free algorithm
    (vs its sparse arm).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for arm, row in sorted(rows.items()):
        if row["char_f1"] is None or row["final_env_reward_vs_control"]["mean"] is None:
            continue
        gain = row["final_env_reward_vs_control"]
        err = None if gain["low"] is None else [[gain["mean"] - gain["low"]], [gain["high"] - gain["mean"]]]
        marker = "o" if row["algorithm"] == "ppo" else "s"
        ax.errorbar([row["char_f1"]], [gain["mean"]], yerr=err, fmt=marker, capsize=4, label=arm)
        if row["gain_at_matched_kl"] is not None:
            ax.scatter([row["char_f1"]], [row["gain_at_matched_kl"]], facecolors="none", edgecolors="k", s=50)
    ax.axhline(0.0, color="grey", lw=1, ls=":")
    ax.set_xlabel("critic char F1 on the SemEval-2021 trial posts")
    ax.set_ylabel("final env reward minus the control (paired 95 % CI)")
    ax.set_title("RL gain over the control vs critic quality (hollow: at matched KL)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def curves_panel(ax, runs: dict[str, list[dict]], key: str, x) -> None:
    """One line per arm: its seed-mean round record `key` against x(round record of its first seed)."""
    for arm, arm_runs in runs.items():
        ax.plot([x(record) for record in arm_runs[0]["rounds"]], seed_mean_curve(arm_runs, key), marker=".",
                label=arm)


def frontier_panel(ax, runs: dict[str, list[dict]], frontier: dict[str, dict]) -> None:
    """Each arm's isotonic reward-vs-KL frontier (analysis.matched_kl's "frontier"), over its seed-mean points."""
    for arm, arm_runs in runs.items():
        line, = ax.plot(frontier[arm]["kl"], frontier[arm]["reward"], lw=2, label=arm)
        ax.scatter(seed_mean_curve(arm_runs, "kl"), seed_mean_curve(arm_runs, "env_reward"), s=10, alpha=0.5,
                   color=line.get_color())
    ax.set_xlabel("KL to reference (nats/response)")


def plot_learning_curves(by_arm: dict[str, list[dict]], *, target: float, batch_size: int, path: Path) -> Path:
    """Each arm's seed-mean env reward and KL against rollouts, and its reward-vs-KL frontier (read at matched KL)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, key in zip(axes, ("env_reward", "kl")):
        curves_panel(ax, by_arm, key, lambda record: record["round"] * batch_size)
        ax.set_xlabel("rollouts")
        ax.set_ylabel(key)
    axes[0].axhline(target, color="grey", ls=":", lw=1, label="sparse's final")
    frontier_panel(axes[2], by_arm, matched_kl(by_arm)["frontier"])
    axes[2].set_ylabel("env_reward")
    axes[2].set_title("isotonic frontier (points: seed means per round)", fontsize=9)
    axes[0].legend(fontsize=7)
    fig.suptitle("Real-text study: mean over seeds per arm", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _ci(interval: dict, digits: int = 3) -> str:
    if interval["mean"] is None:
        return "-"
    if interval["low"] is None:
        return f"{interval['mean']:+.{digits}f} (1 seed)"
    return f"{interval['mean']:+.{digits}f} [{interval['low']:+.{digits}f}, {interval['high']:+.{digits}f}]"


def markdown(rows: dict[str, dict], *, eval_set: str = "world") -> str:
    """The study table: one row per arm, intervals paired over seeds against the arm's control."""
    metrics = ("expected_max_toxicity", "toxicity_probability", "perplexity", "dist_2")
    lines = ["| arm | critic char F1 | seeds | rollouts to its sparse's final | control | Δ reward @KL | "
             "Δ final reward [95 % CI] | " + " | ".join(f"Δ {m}" for m in metrics)
             + " | critic $ at API prices | paid |",
             "|---" * (9 + len(metrics)) + "|"]
    for arm, row in rows.items():
        f1 = "-" if row["char_f1"] is None else f"{row['char_f1']:.3f}"
        gain = "-" if row["gain_at_matched_kl"] is None else f"{row['gain_at_matched_kl']:+.3f}"
        cells = [arm, f1, ",".join(map(str, row["seeds"])), str(row["rollouts_to_sparse_final"] or "-"),
                 row["control"], gain,
                 _ci(row["final_env_reward_vs_control"])]
        cells += [_ci(row["eval_vs_control"].get(f"{eval_set}/{m}", {"mean": None})) for m in metrics]
        cost = row["critic_cost"]
        cells += [f"{cost['at_api_prices_usd']:.4f}", f"{cost['paid_usd']:.4f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def random_markdown(rows: dict[str, dict], *, eval_set: str = "world") -> str:
    """Each dense arm against its algorithm's random-span arm ("" when no arm has one)."""
    lines = [f"| {arm} | {row['vs_random']['arm']} | {','.join(map(str, row['seeds']))} | "
             f"{_ci(row['vs_random']['final_env_reward'])} | "
             f"{_ci(row['vs_random']['eval'].get(f'{eval_set}/expected_max_toxicity', {'mean': None}))} |"
             for arm, row in rows.items() if "vs_random" in row]
    if not lines:
        return ""
    return "\n".join(["| arm | minus | seeds | Δ final reward [95 % CI] | Δ expected_max_toxicity |",
                       "|---|---|---|---|---|", *lines]) + "\n"


BLOCK_START = "<!-- real-text-study:start -->"  # the block of docs/results.md this study owns
BLOCK_END = "<!-- real-text-study:end -->"


def results_block(result: dict) -> str:
    """docs/results.md's real-text block, recomputed from a committed study JSON's raw runs (its `runs` and
    each critic's char F1), so a hand edit of the JSON's report or of the page shows up as a mismatch."""
    window = result["headline"]["final_window"]
    rows = arm_rows(result["runs"], result["real_text"]["critic_quality"], final_window=window,
                    batch_size=result["real_text"]["batch_size"])
    seeds, scale = {arm: len(runs) for arm, runs in result["runs"].items()}, result["scale_factor"]
    lines = [f"### On real text: {result['task']}, SmolLM2-135M with LoRA, {result['rounds']} rounds × "
             f"{result['real_text']['batch_size']} rollouts", "",
             f"Seeds per arm: {', '.join(f'{a} {n}' for a, n in seeds.items())}. Δ columns are the arm minus its "
             f"control, paired by seed, with 95 % t intervals: under PPO sparse_scaled (sparse, its reward scaled by "
             f"k = {scale['k']:.3f} to match {scale['reference']}'s reward {scale['match']}); under a value-free "
             "algorithm (`-grpo`) its own sparse arm, since the group normalisation cancels any scale. Final = mean "
             f"of the last {window} rounds. Eval: held-out prompts, the final policy. Critic char F1: on the "
             "SemEval-2021 trial posts.", "",
             markdown(rows).rstrip("\n")]
    versus = random_markdown(rows)
    if versus:
        lines += ["", "The right tokens, or any dense signal? Each critic's dense arm minus the random-span control "
                  "of the same algorithm (the tagger's span count and lengths at random places), paired by seed:", "",
                  versus.rstrip("\n")]
    return "\n".join(lines) + "\n"
