"""The study's outputs from its JSON: two PNGs, a Markdown results section, and the README splice.

Everything here reads only the result JSON, so the Markdown (and the README section made from
it) can never disagree with the raw numbers.
"""
from __future__ import annotations

import math
from pathlib import Path

from pipeline.errors import DataError

from benchmarks.sample_efficiency_lib.analysis import seed_mean_curve

README_START = "<!-- sample-efficiency:start -->"
README_END = "<!-- sample-efficiency:end -->"
ARM_ORDER = ("sparse", "sparse_scaled", "dense_all", "dense_selective", "dense_zero_mean")


def fmt(value, digits: int = 3) -> str:
    """A number as the tables show it: fixed digits, "-" for None or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def pm(stat: dict, digits: int = 3) -> str:
    return f"{fmt(stat['mean'], digits)} ± {fmt(stat['std'], digits)}"


def _arms(result: dict) -> list[str]:
    return [a for a in ARM_ORDER if a in result["arms"]]


def write_plots(result: dict, out_dir: Path, stem: str) -> dict:
    """Learning curves (env reward, KL, grammatical share, polar words vs rollouts) and the reward-vs-KL frontier."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {arm: result["arms"][arm]["runs"] for arm in _arms(result)}
    panels = (("env_reward", "env reward P(positive)"), ("kl", "KL to reference (nats/response)"),
              ("grammatical", "grammatical share"), ("polar_per_response", "polar words / response"))
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    for ax, (key, label) in zip(axes.flat, panels):
        for arm, arm_runs in runs.items():
            x = [r["rollouts"] for r in arm_runs[0]["rounds"]]
            ax.plot(x, seed_mean_curve(arm_runs, key), marker=".", label=arm)
        if key == "env_reward":
            ax.axhline(result["headline"]["sparse_target"], color="grey", ls=":", lw=1, label="sparse target")
        ax.set_xlabel("rollouts")
        ax.set_ylabel(label)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(f"Sample efficiency ({result['preset']}): mean over seeds {result['config']['seeds']}")
    fig.tight_layout()
    curves = out_dir / f"{stem}_curves.png"
    fig.savefig(curves, dpi=90)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for arm, arm_runs in runs.items():
        frontier = result["headline"]["matched_kl"]["frontier"][arm]
        line, = ax.plot(frontier["kl"], frontier["reward"], lw=2, label=arm)
        ax.scatter(seed_mean_curve(arm_runs, "kl"), seed_mean_curve(arm_runs, "env_reward"), s=10, alpha=0.5,
                   color=line.get_color())
    ax.set_xlabel("KL to reference (nats/response)")
    ax.set_ylabel("env reward P(positive)")
    ax.set_title("Reward vs KL: isotonic frontier (points: seed means per round)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    frontier = out_dir / f"{stem}_frontier.png"
    fig.savefig(frontier, dpi=90)
    plt.close(fig)
    return {"learning_curves": curves.name, "frontier": frontier.name}


def _main_table(result: dict) -> list[str]:
    h = result["headline"]
    gains = h["matched_kl"]["mean_gain_vs"]
    lines = ["| arm | rounds to target | rollouts to target | Δreward vs sparse @KL | Δreward vs sparse_scaled @KL "
             "| eval positive % | eval env reward | eval dist-2 | eval grammatical | final KL | final polar words/resp |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm in _arms(result):
        steps, ev, last = h["steps_to_target"][arm], h["final_eval"][arm], h["final_rounds"][arm]
        lines.append(
            f"| {arm} | {steps['rounds'] if steps['rounds'] is not None else '-'} | "
            f"{steps['rollouts'] if steps['rollouts'] is not None else '-'} | "
            f"{fmt(gains.get('sparse', {}).get(arm))} | {fmt(gains.get('sparse_scaled', {}).get(arm))} | "
            f"{pm(ev['positive_percent'], 1)} | {pm(ev['env_reward_mean'])} | {pm(ev['dist_2'])} | "
            f"{pm(ev['grammatical'])} | {pm(last['kl'], 2)} | {pm(last['polar_per_response'], 2)} |")
    return lines


def _ablation_table(result: dict) -> list[str]:
    ab = result.get("ablation")
    if not ab:
        return []
    lines = [f"Ablation by zero-cost replay of {ab['source']['arm']} seed {ab['source']['seed']}'s "
             f"{ab['source']['rounds']} recorded rounds: {ab['critic']['requests']} cached answers read, "
             f"**{ab['critic']['calls']} critic calls** (asserted zero).", "",
             "| setting | critiqued | intrinsic reward / response | eval env reward | eval positive % | eval grammatical | eval polar words/resp |",
             "|---|---|---|---|---|---|---|"]
    for s in ab["settings"]:
        ev = s["eval"]
        lines.append(f"| {s['setting']['name']} | {s['critiqued']} | {fmt(s['intrinsic_per_response'])} | "
                     f"{fmt(ev['env_reward_mean'])} | {fmt(ev['positive_percent'], 1)} | {fmt(ev['grammatical'])} | "
                     f"{fmt(ev['polar_per_response'], 2)} |")
    return lines


def honest_reading(result: dict) -> list[str]:
    """Sentences derived from the numbers: where dense wins, where it does not, and why it might not."""
    h, out = result["headline"], []
    gains = h["matched_kl"]["mean_gain_vs"]
    noise = h["final_rounds"]["sparse"]["env_reward"]["std"]  # seed-to-seed spread of sparse's final reward
    for arm in ("dense_all", "dense_selective", "dense_zero_mean"):
        vs_scaled, vs_sparse = gains.get("sparse_scaled", {}).get(arm), gains.get("sparse", {}).get(arm)
        if vs_scaled is None:
            out.append(f"- {arm}: no KL level shared with sparse_scaled, so no matched-KL comparison.")
            continue
        versus = (f"vs sparse {fmt(vs_sparse)}, vs sparse_scaled {fmt(vs_scaled)} env reward at matched KL; "
                  f"seed std of sparse's final reward {fmt(noise)}")
        if vs_scaled > noise:
            out.append(f"- {arm} beats the scale-matched control at matched KL ({versus}).")
        elif vs_sparse is not None and vs_sparse > noise:
            out.append(f"- **{arm} does not beat the scale-matched control at matched KL** ({versus}): its gain "
                       "over sparse is matched by scaling the sparse reward, i.e. it comes from reward scale "
                       "against the KL penalty, not from per-token credit.")
        else:
            out.append(f"- **{arm} does not beat sparse or the scale-matched control at matched KL beyond seed "
                       f"noise** ({versus}).")
    steps = h["steps_to_target"]
    out.append(f"- Rounds to the sparse target ({fmt(h['sparse_target'])}): "
               + ", ".join(f"{a} {steps[a]['rounds'] if steps[a]['rounds'] is not None else 'never'}" for a in _arms(result))
               + f" (of {result['config']['rounds']}).")
    k = result["scale_factor"]
    out.append(f"- Scale factor k = {fmt(k['k'])} (dense_all mean total reward {fmt(k['dense_all_mean_total_reward'])} / "
               f"sparse mean env reward {fmt(k['sparse_mean_env_reward'])}); sparse_scaled reached a mean total reward of "
               f"{fmt(k['sparse_scaled_mean_total_reward'])}.")
    d, c = h["final_rounds"]["dense_all"], h["final_rounds"].get("sparse_scaled", h["final_rounds"]["sparse"])
    out.append(f"- Hacking check (last {result['config']['final_window']} rounds, dense_all vs sparse_scaled): "
               f"{fmt(d['polar_per_response']['mean'], 2)} vs {fmt(c['polar_per_response']['mean'], 2)} polar words per "
               f"response, {fmt(d['grammatical']['mean'])} vs {fmt(c['grammatical']['mean'])} grammatical, repeated-polar "
               f"share {fmt(d['repeated_polar_share']['mean'])} vs {fmt(c['repeated_polar_share']['mean'])}, dist-2 "
               f"{fmt(d['dist_2']['mean'])} vs {fmt(c['dist_2']['mean'])}. dense_all pays for every positive word it "
               "finds, so piling them up is what it is trained to do; dist-2 does not flag it.")
    out += ["- Why dense gains are small, absent or suspect here: in this world sentiment is carried by polar words, so "
            "the sequence reward already points at the tokens the critic names, and 20-token responses leave little "
            "credit to assign; the lexicon critic is never wrong (best case for accuracy, not for added information), "
            "and the environment classifier also rises with every extra positive word, so a dense gain here partly "
            "measures that the critic and the classifier agree. Seeds are few (see the ± columns): differences "
            "smaller than the std are not evidence. The ablation is one seed of off-policy replay: read it for "
            "direction only."]
    return out


def projected_seconds(result: dict, target) -> float:
    """Wall seconds a study of config `target` would take at the speeds this result measured.

    Arm rounds and replayed rounds scale with rounds x batch, evaluation with the number of eval
    samples; the base model is not included (built once per world seed, then cached).
    """
    cfg, runs = result["config"], [run for arm in result["arms"].values() for run in arm["runs"]]
    per_rollout = sum(r["seconds"] for run in runs for r in run["rounds"]) / (len(runs) * cfg["rounds"] * cfg["batch_size"])
    eval_samples = cfg["n_eval_prompts"] * cfg["eval_samples_per_prompt"]
    per_sample = sum(run["seconds"] - sum(r["seconds"] for r in run["rounds"]) for run in runs) / (len(runs) * eval_samples)
    settings = result["ablation"]["settings"]
    replay_per_rollout = sum(s["seconds"] for s in settings) / (len(settings) * cfg["rounds"] * cfg["batch_size"])
    n_runs, rollouts = len(result["arms"]) * len(target.seeds), target.rounds * target.batch_size
    target_samples = target.n_eval_prompts * target.eval_samples_per_prompt
    return (n_runs * (rollouts * per_rollout + target_samples * per_sample) + len(target.seeds) * target_samples * per_sample
            + len(settings) * rollouts * replay_per_rollout)


def _projection_note(result: dict) -> str:
    from benchmarks.sample_efficiency_lib.config import preset

    if result["preset"] == "full":
        return ""
    full = preset("full")
    return (f" Projected full study ({len(full.seeds)} seeds × {full.rounds} rounds × {full.batch_size} rollouts, "
            f"{full.n_eval_prompts}×{full.eval_samples_per_prompt} eval samples) at this run's measured speed: "
            f"{projected_seconds(result, full) / 60:.0f} min plus the base model if it is not cached.")


def _base_note(result: dict) -> str:
    built = result["base"].get("built") or {}
    if result["base"]["cached"]:
        seconds = f" ({built['seconds']:.0f} s when it was built)" if "seconds" in built else ""
        return f", base model from the scratch cache{seconds}"
    return f", base model pretraining included ({result['base']['seconds']:.0f} s)"


def markdown(result: dict) -> str:
    """The results section (Markdown) generated from the result JSON."""
    c, cr, w = result["config"], result["critic"], result["world"]
    lines = [f"### Sample efficiency: dense critic rewards vs sparse PPO ({result['preset']} run)", "",
             f"World: {w['name']}. Env reward: {w['env_reward']}. Critic: {w['critic']}. "
             f"{len(c['seeds'])} seeds × {c['rounds']} rounds × {c['batch_size']} rollouts per arm; "
             f"target = sparse's seed-mean env reward over its last {c['final_window']} rounds = "
             f"{fmt(result['headline']['sparse_target'])}; rounds to target = the first round whose rollouts' seed-mean env "
             f"reward reaches it (rollouts = rounds × batch, the measuring batch included). Δreward @KL = mean over the sparse arm's per-round KL "
             f"levels of the arm's reward-vs-KL frontier (isotonic fit of seed-mean reward on seed-mean KL over rounds, "
             f"interpolated, never extrapolated) minus the other arm's. Wall time "
             f"{result['wall_seconds'] / 60:.1f} min on a shared 2-core machine{_base_note(result)}.{_projection_note(result)}", "",
             *_main_table(result), "",
             f"Critic: {cr['requests']} requests, {cr['calls']} calls, {cr['cache_hits']} cache hits; the calls "
             f"would have cost ${cr['cost_usd']:.4f} at gpt-3.5-turbo prices (${cr['cost_without_cache_usd']:.4f} "
             f"without the cache; tokens estimated as characters/4).", "",
             *_ablation_table(result), "",
             f"![learning curves](benchmarks/results/{result['images']['learning_curves']})",
             f"![reward vs KL](benchmarks/results/{result['images']['frontier']})", "",
             "Reading:", *honest_reading(result), "",
             f"What the world can show: {w['can_show']} What it cannot: {w['cannot_show']}", ""]
    return "\n".join(lines)


def splice_readme(readme: str | Path, section: str) -> None:
    """Replace the text between the sample-efficiency markers of `readme` with `section`.

    Raises: DataError if the file lacks the start or end marker (or has them in the wrong order).
    """
    path = Path(readme)
    text = path.read_text(encoding="utf-8")
    start, end = text.find(README_START), text.find(README_END)
    if start < 0 or end < start:
        raise DataError(f"{path} has no '{README_START}' ... '{README_END}' block; add both markers where the "
                        "results section should go")
    path.write_text(text[:start + len(README_START)] + "\n" + section.rstrip("\n") + "\n" + text[end:], encoding="utf-8")
