"""Run a smol profile end to end and report it: stage times, the real critic's answers, rewards, evaluation.

    python benchmarks/smol_run.py --run DIR --repro --log LOG --out RESULT.json

DIR is a checkout whose params.yaml is the profile (e.g. `cp configs/smol-sentiment.yaml
params.yaml`). `--repro` runs `dvc repro` there and writes LOG: every output line prefixed with
the Unix time it was read, so each stage's wall time is the gap between its "Running stage" line
and the next one; `--target critique@0001` reproduces only up to that stage (one round's critic
answers, e.g. once per `critic.answer_format`). Without `--repro` an existing LOG (or none) is
read. The report reads only the run's own outputs (Parquet through DuckDB, metrics JSON):

- ``stage_seconds``: wall seconds per stage, and their total (stages DVC skipped take none);
- ``critic_rounds``: per round, the status shares of the critiqued answers, spans proposed and
  kept per answer, and the share of proposed spans that occur in the response (alignment's
  matching: ``pipeline.critic.align.find_occurrences``); for sentiment also the micro span
  precision / recall (IoU >= 0.5, same label; ``pipeline.audit.span_metrics``) and the mean
  character F1 of the kept spans against a silver standard, the VADER-lexicon spans of drlc's
  lexicon critic (``pipeline.critic.offline.lexicon.sentiment_spans``, negations included), with
  the char F1 of marking nothing and of marking every character with both labels;
- ``reward_curve``: metrics/rounds.json (the evaluate stage's per-round means);
- ``evaluation``: metrics/eval.json, base against the final policy;
- ``samples``: the first sample of the first N eval prompts, base and final side by side;
- with ``--compare RUN2`` (the same profile with ``critic.enabled: false``, say): paired
  differences of the eval env_reward, this run's final policy minus RUN2's, and each final minus
  base, with 95% intervals over prompts.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from pipeline.audit.span_metrics import score_post, span_precision_recall
from pipeline.core.store import connect
from pipeline.critic.align import find_occurrences
from pipeline.critic.offline.lexicon import sentiment_spans

_RUNNING = re.compile(r"^(\d+) Running stage '([^']+)'")


def repro(run: Path, log: Path, targets: list[str] = ()) -> int:
    """`dvc repro [TARGETS]` in `run`, each output line written to `log` after the Unix time it was read."""
    env = os.environ | {"PYTHONPATH": str(run)}
    with log.open("w") as out:
        out.write(f"{int(time.time())} START loadavg {os.getloadavg()}\n")
        process = subprocess.Popen(["dvc", "repro", *targets], cwd=run, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, bufsize=1)
        for line in process.stdout:
            out.write(f"{int(time.time())} {line}")
            out.flush()
        code = process.wait()
        out.write(f"{int(time.time())} END rc={code} loadavg {os.getloadavg()}\n")
    return code


def stage_seconds(log: Path) -> dict:
    """{stage: wall seconds} from a timestamped repro log; the last stage ends at the last line."""
    lines = [line for line in log.read_text().splitlines() if re.match(r"^\d+ ", line)]
    if not lines:
        raise SystemExit(f"{log} has no timestamped lines: write it with --repro (or a wrapper that prefixes "
                         "each dvc repro line with the Unix time)")
    starts = [(int(m[1]), m[2]) for m in map(_RUNNING.match, lines) if m]
    end = int(lines[-1].split()[0])
    seconds = {name: (starts[i + 1][0] if i + 1 < len(starts) else end) - t for i, (t, name) in enumerate(starts)}
    return {"stages": seconds, "total": sum(seconds.values())}


def _silver(response: str) -> list[tuple[str, int, int]]:
    """The VADER-lexicon spans of a response, where they occur: the silver standard."""
    return [(label, start, end) for label, span in sentiment_spans(response)
            for start, end in find_occurrences(response, span)]


def _silver_scores(row: dict) -> object:
    """score_post of a critiqued answer's kept spans against the VADER-lexicon spans of its response."""
    predicted = [(s["label"], s["start"], s["end"]) for s in row["spans"] if s["start"] >= 0]
    return score_post(predicted, _silver(row["response"]))


def _silver_baselines(responses: list[str]) -> dict:
    """Mean char F1 against the silver spans of marking nothing, and of marking everything with both labels."""
    def mean_f1(predict) -> float:
        return sum(score_post(predict(r), _silver(r)).char_f1 for r in responses) / len(responses)

    return {"nothing": mean_f1(lambda r: []),
            "everything": mean_f1(lambda r: [("positive", 0, len(r)), ("negative", 0, len(r))])}


def critic_rounds(data: Path, task: str) -> list[dict]:
    """Per-round critic answer statistics (see the module docstring)."""
    con = connect(data)
    rows = con.execute(
        "SELECT a.round, a.status, a.items, a.spans, r.response FROM annotations a "
        "JOIN rollouts r USING (run_id, round, rollout_id) WHERE a.critiqued ORDER BY a.round, a.rollout_id"
    ).fetch_df().to_dict("records")
    out = []
    for round_ in sorted({r["round"] for r in rows}):
        answers = [r for r in rows if r["round"] == round_]
        proposed = [bool(find_occurrences(r["response"], item["text"])) for r in answers for item in r["items"]
                    if item["text"].strip()]
        statuses = sorted({r["status"] for r in answers})
        entry = {
            "round": int(round_), "critiqued": len(answers),
            "status_share": {s: sum(r["status"] == s for r in answers) / len(answers) for s in statuses},
            "proposed_per_answer": len(proposed) / len(answers),
            "kept_spans_per_answer": sum(len(r["spans"]) for r in answers) / len(answers),
            "in_response_share": sum(proposed) / len(proposed) if proposed else None,
        }
        if task == "sentiment":
            scores = [_silver_scores(r) for r in answers]
            entry["vader_silver"] = span_precision_recall(scores) | {
                "kept_spans": sum(s.n_pred_spans for s in scores), "silver_spans": sum(s.n_gold_spans for s in scores),
                "char_f1": sum(s.char_f1 for s in scores) / len(scores),
                "baselines_char_f1": _silver_baselines([r["response"] for r in answers])}
        out.append(entry)
    return out


def samples(data: Path, final: str, n: int) -> list[dict]:
    """The first sample of the first `n` eval prompts (by prompt id), base and `final` policy."""
    con = connect(data)
    rows = con.execute(
        "SELECT prompt_id, policy, query, response, env_reward FROM eval_samples WHERE sample = 0 "
        "AND prompt_id IN (SELECT DISTINCT prompt_id FROM eval_samples ORDER BY prompt_id LIMIT ?) "
        "ORDER BY prompt_id, policy", [n]).fetch_df().to_dict("records")
    by_prompt: dict[str, dict] = {}
    for r in rows:
        side = "base" if r["policy"] == "base" else "final"
        by_prompt.setdefault(r["prompt_id"], {"prompt_id": r["prompt_id"], "query": r["query"]})[side] = {
            "policy": r["policy"], "response": r["response"], "env_reward": r["env_reward"]}
    return list(by_prompt.values())


def paired_difference(data_a: Path, data_b: Path, policy_a: str, policy_b: str) -> dict:
    """Mean over eval prompts of (policy_a's - policy_b's) mean env_reward on the prompt, with a 95% interval.

    Both runs sample their eval policies with the same seeds, so samples pair up by (prompt,
    sample); the interval treats prompts, not samples, as the independent units (1.96 x the
    standard error of the per-prompt differences).
    """
    def per_prompt(data: Path, policy: str) -> dict:
        return dict(connect(data).execute(
            "SELECT prompt_id, avg(env_reward) FROM eval_samples WHERE policy = ? GROUP BY prompt_id",
            [policy]).fetchall())

    a, b = per_prompt(data_a, policy_a), per_prompt(data_b, policy_b)
    if set(a) != set(b) or len(a) < 2:
        raise SystemExit(f"the two runs evaluated different prompts ({len(a)} vs {len(b)}): compare runs of one profile")
    diffs = [a[k] - b[k] for k in sorted(a)]
    mean = sum(diffs) / len(diffs)
    std = (sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)) ** 0.5
    return {"a": f"{data_a.parent.name}:{policy_a}", "b": f"{data_b.parent.name}:{policy_b}", "prompts": len(diffs), "mean": mean,
            "ci95": 1.96 * std / len(diffs) ** 0.5}


def yaml_params(run: Path) -> dict:
    import yaml

    return yaml.safe_load((run / "params.yaml").read_text())


def _metrics(path: Path) -> object:
    """A metrics file's JSON, or None when the run has not reached the stage that writes it (--target)."""
    return json.loads(path.read_text()) if path.exists() else None


def report(run: Path, log: Path | None, n_samples: int) -> dict:
    params = yaml_params(run)
    metrics = run / "metrics"
    evaluated = (metrics / "eval.json").exists()
    return {
        "run_id": params["run"]["run_id"], "task": params["run"]["task"],
        "critic_enabled": params["critic"]["enabled"], "seed": params["run"]["seed"],
        "rollouts_per_round": params["rollout"]["batch_size"], "rounds": len(params["rounds"] or {}),
        "stage_seconds": stage_seconds(log) if log and log.exists() else None,
        "critic_rounds": critic_rounds(run / "data", params["run"]["task"]) if params["critic"]["enabled"] else [],
        "reward_curve": _metrics(metrics / "rounds.json"),
        "evaluation": _metrics(metrics / "eval.json"),
        "samples": samples(run / "data", params["evaluate"]["policy"], n_samples) if evaluated else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, type=Path, help="checkout with the profile as params.yaml")
    parser.add_argument("--log", type=Path, help="timestamped dvc repro log (written with --repro)")
    parser.add_argument("--repro", action="store_true", help="run dvc repro first, writing --log")
    parser.add_argument("--target", action="append", default=[],
                        help="with --repro: reproduce only up to this stage (repeatable), e.g. critique@0001 "
                             "for one round's critic answers; the report then has no reward curve or evaluation")
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--compare", type=Path, help="a second run of the profile (e.g. critic.enabled=false): "
                        "paired eval differences final-vs-final and each final-vs-base")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    if args.repro:
        if args.log is None:
            parser.error("--repro needs --log")
        code = repro(args.run.resolve(), args.log, args.target)
        if code:
            sys.exit(f"dvc repro failed (exit {code}); see {args.log}")
    result = report(args.run, args.log, args.samples)
    if args.compare:
        if result["evaluation"] is None:
            parser.error("--compare needs an evaluated run (no metrics/eval.json: drop --target)")
        final = result["evaluate_policy"] = yaml_params(args.run)["evaluate"]["policy"]
        result["compare"] = {"run": str(args.compare), "differences": [
            paired_difference(args.run / "data", args.compare / "data", final, final),
            paired_difference(args.run / "data", args.run / "data", final, "base"),
            paired_difference(args.compare / "data", args.compare / "data", final, "base")]}
    args.out.write_text(json.dumps(result, indent=2, default=float) + "\n")
    print(json.dumps({k: result[k] for k in ("run_id", "stage_seconds", "evaluation")}, indent=2, default=float))


if __name__ == "__main__":
    main()
