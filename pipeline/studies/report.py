"""The study's outputs from its JSON: two PNGs, a Markdown results section, and its splice into docs/results.md.

Everything here reads only the result JSON, so the Markdown (and the docs/results.md block made
from it) can never disagree with the raw numbers.
"""
from __future__ import annotations

from pathlib import Path

from pipeline.studies import generated_blocks
from pipeline.studies.analysis import seed_mean_curve
from pipeline.studies.reading import ARM_ORDER, fmt, honest_reading, pm
from pipeline.studies.tasks import VIEWS

BLOCK_START = "<!-- sample-efficiency:start -->"  # the block of docs/results.md this study owns
BLOCK_END = "<!-- sample-efficiency:end -->"
TASK_ORDER = ("sentiment", "toxicity", "summarization")
IMAGES = "../benchmarks/results/"  # the PNGs, relative to docs/results.md where the section is spliced


def _arms(result: dict) -> list[str]:
    return [a for a in ARM_ORDER if a in result["arms"]]


def task_of(result: dict) -> str:
    """The task of one task's result (results written before the per-task layer are sentiment)."""
    return result.get("task", "sentiment")


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


def write_plots(result: dict, out_dir: Path, stem: str) -> dict:
    """One task's learning curves (its view's four panels vs rollouts) and its reward-vs-KL frontier."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {arm: result["arms"][arm]["runs"] for arm in _arms(result)}
    view = VIEWS[task_of(result)]
    panels = view.panels
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    for ax, (key, label) in zip(axes.flat, panels):
        curves_panel(ax, runs, key, lambda record: record["rollouts"])
        if key == "env_reward":
            ax.axhline(result["headline"]["sparse_target"], color="grey", ls=":", lw=1, label="sparse target")
        ax.set_xlabel("rollouts")
        ax.set_ylabel(label)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(f"Sample efficiency, {task_of(result)} ({result['preset']}): mean over seeds {result['config']['seeds']}")
    fig.tight_layout()
    curves = out_dir / f"{stem}_curves.png"
    fig.savefig(curves, dpi=90)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    frontier_panel(ax, runs, result["headline"]["matched_kl"]["frontier"])
    ax.set_ylabel(view.reward_label)
    ax.set_title(f"{task_of(result)}: reward vs KL, isotonic frontier (points: seed means per round)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    frontier = out_dir / f"{stem}_frontier.png"
    fig.savefig(frontier, dpi=90)
    plt.close(fig)
    return {"learning_curves": curves.name, "frontier": frontier.name}


def _main_table(result: dict) -> list[str]:
    h, view = result["headline"], VIEWS[task_of(result)]
    gains = h["matched_kl"]["mean_gain_vs"]
    titles = [t for _, t, _ in view.eval_columns + view.final_columns]
    lines = ["| arm | rounds to target | rollouts to target | Δreward vs sparse @KL | Δreward vs sparse_scaled @KL | "
             + " | ".join(titles) + " |", "|---" * (5 + len(titles)) + "|"]
    for arm in _arms(result):
        steps, ev, last = h["steps_to_target"][arm], h["final_eval"][arm], h["final_rounds"][arm]
        cells = [arm, str(steps["rounds"]) if steps["rounds"] is not None else "-",
                 str(steps["rollouts"]) if steps["rollouts"] is not None else "-",
                 fmt(gains.get("sparse", {}).get(arm)), fmt(gains.get("sparse_scaled", {}).get(arm))]
        cells += [pm(ev[key], digits) for key, _, digits in view.eval_columns]
        cells += [pm(last[key], digits) for key, _, digits in view.final_columns]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _ablation_table(result: dict) -> list[str]:
    ab, view = result.get("ablation"), VIEWS[task_of(result)]
    if not ab:
        return []
    lines = [f"Ablation by zero-cost replay of {ab['source']['arm']} seed {ab['source']['seed']}'s "
             f"{ab['source']['rounds']} recorded rounds: {ab['critic']['requests']} cached answers read, "
             f"**{ab['critic']['calls']} critic calls** (asserted zero).", "",
             "| setting | critiqued | intrinsic reward / response | " + " | ".join(t for _, t, _ in view.ablation_columns) + " |",
             "|---" * (3 + len(view.ablation_columns)) + "|"]
    for s in ab["settings"]:
        cells = [s["setting"]["name"], str(s["critiqued"]), fmt(s["intrinsic_per_response"])]
        cells += [fmt(s["eval"].get(key), digits) for key, _, digits in view.ablation_columns]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


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
    from pipeline.studies.config import preset

    if result["preset"] == "full":
        return ""
    full = preset("full", task_of(result))
    return (f" Projected full study ({len(full.seeds)} seeds × {full.rounds} rounds × {full.batch_size} rollouts, "
            f"{full.n_eval_prompts}×{full.eval_samples_per_prompt} eval samples) at this run's measured speed: "
            f"{projected_seconds(result, full) / 60:.0f} min plus the base model if it is not cached.")


def _base_note(result: dict) -> str:
    built = result["base"].get("built") or {}
    if result["base"]["cached"]:
        seconds = f" ({built['seconds']:.0f} s when it was built)" if "seconds" in built else ""
        return f", base model from the scratch cache{seconds}"
    return f", base model pretraining included ({result['base']['seconds']:.0f} s)"


def task_markdown(result: dict) -> list[str]:
    """The Markdown lines of one task's results, generated from its result JSON."""
    c, cr, w = result["config"], result["critic"], result["world"]
    k = result["scale_factor"]
    return [f"#### {task_of(result)}", "",
            f"World: {w['name']}. Env reward: {w['env_reward']}. Critic: {w['critic']}. "
            f"{len(c['seeds'])} seeds × {c['rounds']} rounds × {c['batch_size']} rollouts per arm, PPO learning rate "
            f"{c['ppo']['learning_rate']:g}; target = sparse's seed-mean env reward over its last {c['final_window']} "
            f"rounds = {fmt(result['headline']['sparse_target'])}; sparse_scaled's k = {fmt(k['k'])} "
            f"(matched by {k.get('match', 'mean')}). Wall time {result['wall_seconds'] / 60:.1f} min on a shared "
            f"2-core machine{_base_note(result)}.{_projection_note(result)}", "",
            *_main_table(result), "",
            f"Critic: {cr['requests']} requests, {cr['calls']} calls, {cr['cache_hits']} cache hits; the calls "
            f"would have cost ${cr['cost_usd']:.4f} at gpt-3.5-turbo prices (${cr['cost_without_cache_usd']:.4f} "
            f"without the cache; tokens estimated as characters/4).", "",
            *_ablation_table(result), "",
            f"![learning curves]({IMAGES}{result['images']['learning_curves']})",
            f"![reward vs KL]({IMAGES}{result['images']['frontier']})", "",
            "Reading:", *honest_reading(result), "",
            f"What the world can show: {w['can_show']} What it cannot: {w['cannot_show']}", ""]


def markdown(study: dict) -> str:
    """The results section (Markdown) generated from the study JSON (every task in it)."""
    tasks = [t for t in TASK_ORDER if t in study["tasks"]]
    walls = ", ".join(f"{t} {study['tasks'][t]['wall_seconds'] / 60:.1f} min" for t in tasks)
    total = sum(study["tasks"][t]["wall_seconds"] for t in tasks) / 60
    lines = [f"### Sample efficiency: dense critic rewards vs sparse PPO ({study['preset']} run)", "",
             "Five PPO arms per task (sparse; sparse × k, the scale-matched control; dense on every response; dense "
             "on low-reward responses only; dense with zero-mean intrinsic rewards) and two GRPO arms (no value head; "
             "4 responses to each of batch / 4 prompts a round, so the same rollouts, minibatches and optimizer steps "
             "per round; a fixed β = 0.04 as a k3 loss term: grpo_sparse on the env reward alone, grpo_dense with "
             "the critic's per-token term at ppo.dense_weight 1 on every response), the same rounds × batch rollouts "
             "per arm within a task, every arm from the same cached base model. Rounds to target = the first round "
             "whose rollouts' seed-mean env reward reaches sparse's final reward (rollouts = rounds × batch, the "
             "measuring batch included). Δreward @KL = mean over the sparse arm's per-round KL levels of the arm's "
             "reward-vs-KL frontier (isotonic fit of seed-mean reward on seed-mean KL over rounds, interpolated, never "
             "extrapolated) minus the other arm's. Final KL and the other 'final' columns are means over the last "
             "rounds; eval columns are held-out nucleus samples of the final policy (mean ± std over seeds).", "",
             f"Wall time per task: {walls} (total {total:.1f} min), measured on a 2-core machine shared with other "
             "jobs, so these are pessimistic.", ""]
    for task in tasks:
        lines += task_markdown(study["tasks"][task])
    return "\n".join(lines)


def splice_doc(path: str | Path, section: str) -> None:
    """Replace the text between the sample-efficiency markers of the Markdown file at `path` (docs/results.md)
    with `section`.

    Raises: DataError if the file lacks the start or end marker (or has them in the wrong order).
    """
    generated_blocks.splice_file(path, section, BLOCK_START, BLOCK_END)
