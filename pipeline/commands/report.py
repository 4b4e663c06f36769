"""`drlc report RUN ...`: compare finished runs side by side.

A run is the output folder of a finished `dvc repro` (it holds metrics/eval.json and
metrics/rounds.json) or of `drlc replay` (which evaluates its final policy too, unless run
with --no-evaluate). The report is a Markdown table of every metric, one column per run plus
one delta column (run - first run) for each later run, and a PNG of the training curves with
one line per run. In the table, the evaluated policy of each run is called `final`, so runs
with different round counts line up; `train/*` rows summarise metrics/rounds.json.

Summarization runs evaluated with a reward model (evaluate.reward_model) keep each sample's
RM score in data/eval_samples/; when the first run and a later run both have them, the report
adds the later run's pairwise win rate against the first, per prompt set
(pipeline/evaluate/metrics.py `pairwise_win_rate`: every sample meets every sample of the
same prompt, ties count half, mean over the prompts both runs evaluated).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from pipeline.core.errors import DataError
from pipeline.evaluate.curves import CURVE_COLUMNS
from pipeline.evaluate.metrics import pairwise_win_rate

PLOTTED = ["env_reward_mean", "intrinsic_reward_sum", "kl", "critic_requests", "cache_hit_rate", "critic_cost_usd_total"]


def _read_json(run: Path, name: str) -> dict:
    path = run / "metrics" / name
    if not path.is_file():
        raise DataError(f"Run folder '{run}' has no metrics/{name}: pass the output folder of a finished run "
                        "(after `dvc repro`).")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise DataError(f"'{path}' is not valid JSON ({err.msg}): re-run the evaluate stage.") from None


def load_run(run_dir: str | Path) -> tuple[dict[str, float], list[dict]]:
    """({metric name: value}, curve rows) of one finished run.

    Metric names are `<base|final>/<prompt set>/<metric>` and `train/<summary>`.
    Raises: DataError if the folder or one of its metrics files is missing or malformed.
    """
    run = Path(run_dir)
    if not run.is_dir():
        raise DataError(f"Run folder '{run}' not found: pass the output folders of finished runs.")
    curves = _read_json(run, "rounds.json").get("rounds")
    # A replay run with --no-evaluate has training curves but no evaluation.
    evaluation = _read_json(run, "eval.json") if (run / "metrics" / "eval.json").is_file() else {}
    if not isinstance(curves, list) or not curves:
        raise DataError(f"'{run}/metrics/rounds.json' has no 'rounds' list: re-run the evaluate stage.")
    metrics = {}
    for policy, by_set in evaluation.items():
        label = "base" if policy == "base" else "final"
        for set_name, values in by_set.items():
            for metric, value in values.items():
                metrics[f"{label}/{set_name}/{metric}"] = value
    last = curves[-1]
    metrics["train/rounds"] = len(curves)
    for column in ("env_reward_mean", "intrinsic_reward_sum", "kl"):
        metrics[f"train/last_round_{column}"] = last.get(column)
    metrics["train/critic_requests_total"] = sum(c.get("critic_requests") or 0 for c in curves)
    metrics["train/critic_cost_usd_total"] = sum(c.get("critic_cost_usd") or 0.0 for c in curves)
    return metrics, curves


def load_rm_scores(run_dir: str | Path) -> dict[tuple[str, str], list[float]]:
    """{(prompt_id, query): RM scores of the final policy's samples} from data/eval_samples; {} if none.

    prompt_id is "<prompt set>/<id>"; the query is part of the key so that two runs whose
    prompt ids name different documents are never compared. Tables written before the
    rm_score column existed, and samples without a score, contribute nothing.
    """
    import pyarrow.parquet as pq

    scores: dict[tuple[str, str], list[float]] = {}
    for path in sorted(Path(run_dir).glob("data/eval_samples/*/part-0.parquet")):
        table = pq.read_table(path)
        if "rm_score" not in table.column_names:
            continue
        for row in table.select(["policy", "prompt_id", "query", "rm_score"]).to_pylist():
            if row["policy"] != "base" and row["rm_score"] is not None:
                scores.setdefault((row["prompt_id"], row["query"]), []).append(row["rm_score"])
    return scores


def win_rate_table(names: list[str], rm_scores: list[dict]) -> str:
    """Markdown rows: each later run's pairwise RM win rate against the first run, per prompt set; "" if none."""
    lines = []
    for name, scores in zip(names[1:], rm_scores[1:]):
        shared = sorted(set(scores) & set(rm_scores[0]))
        for prompt_set in sorted({prompt_id.split("/", 1)[0] for prompt_id, _ in shared}):
            keys = [k for k in shared if k[0].split("/", 1)[0] == prompt_set]
            rate = pairwise_win_rate([scores[k] for k in keys], [rm_scores[0][k] for k in keys])
            lines.append(f"| {prompt_set} | {name} | {names[0]} | {_fmt(rate)} | {len(keys)} |")
    if not lines:
        return ""
    return ("## Pairwise win rate (reward model)\n\nShare of sample pairs of the same prompt in which the run's "
            "final policy scores higher than the reference run's (ties count half), mean over shared prompts.\n\n"
            "| prompt set | run | vs | win rate | prompts |\n|---|---|---|---|---|\n" + "\n".join(lines) + "\n\n")


def _fmt(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value)}"
    return f"{value:.4g}"


def _delta(value, first) -> str:
    if value is None or first is None:
        return "–"
    d = value - first
    return "0" if d == 0 else f"{d:+.4g}"


def markdown_table(names: list[str], metrics: list[dict[str, float]]) -> str:
    """The side-by-side table: metric | each run | Δ of each later run vs the first."""
    keys = list(dict.fromkeys(k for m in metrics for k in m))
    header = ["metric", *names, *[f"Δ {n} − {names[0]}" for n in names[1:]]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for key in keys:
        values = [m.get(key) for m in metrics]
        cells = [key, *map(_fmt, values), *[_delta(v, values[0]) for v in values[1:]]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_curves(names: list[str], curves: list[list[dict]], path: Path) -> Path:
    """A PNG grid, one panel per curve in PLOTTED, x = round, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(13, 7), constrained_layout=True)
    for ax, column in zip(axes.flat, PLOTTED):
        for i, (name, rows) in enumerate(zip(names, curves)):
            points = [(r["round"], r[column]) for r in rows if r.get(column) is not None]
            ax.plot([x for x, _ in points], [y for _, y in points], marker="os^Dv"[i % 5],
                    linestyle=("-", "--", ":", "-.")[i % 4], label=name)  # overlapping runs stay visible
        ax.set_title(column)
        ax.set_xlabel("round")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize="small")
    fig.suptitle("drlc training curves")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _run_names(run_dirs: list[str]) -> list[str]:
    """The shortest trailing path parts that tell the runs apart ('dense/project', 'sparse/project')."""
    parts = [Path(r).resolve().parts for r in run_dirs]
    for k in range(1, max(map(len, parts)) + 1):
        names = ["/".join(p[-k:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return [f"{i}:{n}" for i, n in enumerate(names)]  # the same folder given twice


def view_links(names: list[str], run_dirs: list[str], out: Path) -> str:
    """The report's section linking each run's span viewer page (`drlc view RUN` writes RUN/reports/view.html)."""
    import os

    lines = []
    for name, run in zip(names, run_dirs):
        page = Path(run) / "reports" / "view.html"
        lines.append(f"- `{name}`: [{page.name}]({Path(os.path.relpath(page.resolve(), out.resolve())).as_posix()})"
                     if page.is_file() else f"- `{name}`: no page yet; run `drlc view {run}`")
    return "## Critic spans per token\n\n" + "\n".join(lines) + "\n\n"


def write_report(run_dirs: list[str], out_dir: str = "reports") -> dict[str, Path]:
    """Write `report.md` (metrics side by side, deltas vs the first run) and `curves.png` to out_dir.

    Params: run_dirs: output folders of finished runs (at least one); the first is the reference.
    Returns: {"markdown": path of report.md, "curves_png": path of curves.png}.
    Raises: DataError if no run is given or a run folder lacks metrics/rounds.json. A run without
    metrics/eval.json (a replay with --no-evaluate) contributes its training rows only.
    """
    if not run_dirs:
        raise DataError("No run folder given: pass one or more output folders of finished runs.")
    loaded = [load_run(r) for r in run_dirs]
    names = _run_names(run_dirs)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    png = plot_curves(names, [c for _, c in loaded], out / "curves.png")
    runs = "\n".join(f"- `{n}`: {Path(r).resolve()}" for n, r in zip(names, run_dirs))
    text = (f"# drlc report\n\nRuns (the first is the reference for the Δ columns):\n\n{runs}\n\n"
            f"## Metrics\n\n{markdown_table(names, [m for m, _ in loaded])}\n"
            f"`final` = the run's evaluated policy (evaluate.policy). Curve columns: {', '.join(CURVE_COLUMNS)}.\n\n"
            f"{win_rate_table(names, [load_rm_scores(r) for r in run_dirs])}"
            f"{view_links(names, run_dirs, out)}"
            f"## Training curves\n\n![training curves]({png.name})\n")
    md = out / "report.md"
    md.write_text(text, encoding="utf-8")
    return {"markdown": md, "curves_png": png}
