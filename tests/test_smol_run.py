"""benchmarks/smol_run.py's report: stage times from a timestamped log, critic answer statistics by hand."""
from pathlib import Path

import pytest

from benchmarks.smol_run import critic_rounds, stage_seconds
from pipeline.core.store import SCHEMAS, partition_dir, write_table

ROOT = Path(__file__).resolve().parents[1]


def test_stage_seconds_are_the_gaps_between_running_lines(tmp_path):
    log = tmp_path / "repro.log"
    log.write_text("100 START\n100 Stage 'prepare' didn't change, skipping\n105 Running stage 'rollout@0001':\n"
                   "106 > python stages/rollout.py\n130 Running stage 'critique@0001':\n131 progress\n"
                   "200 Running stage 'ppo@0001':\n290 END rc=0\n")
    assert stage_seconds(log) == {"stages": {"rollout@0001": 25, "critique@0001": 70, "ppo@0001": 90},
                                  "total": 185}


def _row(table: str, **values) -> dict:
    empty = {"string": "", "int32": 0, "int64": 0, "double": 0.0, "float": 0.0, "bool": False}
    row = {f.name: empty.get(str(f.type), []) for f in SCHEMAS[table]}
    return row | {"run_id": "t", "round": 1} | values


def _span(label, text, response):
    start = response.find(text)
    return {"label": label, "text": text, "start": start, "end": start + len(text) if start >= 0 else -1,
            "reward": 0.5}


def test_critic_rounds_by_hand(tmp_path):
    responses = {"a": "The acting was great but the plot was awful.", "b": "It was a film.", "c": "So boring."}
    rollouts = [_row("rollouts", rollout_id=k, response=v) for k, v in responses.items()]
    a = responses["a"]
    annotations = [
        # proposes 3 spans, 2 in the response; keeps "great" (matches VADER's "great") and "the plot" (no match)
        _row("annotations", rollout_id="a", critiqued=True, status="ok",
             items=[{"label": "positive", "text": "great"}, {"label": "negative", "text": "the plot"},
                    {"label": "positive", "text": "lovely"}],
             spans=[_span("positive", "great", a), _span("negative", "the plot", a)]),
        _row("annotations", rollout_id="b", critiqued=True, status="truncated"),
        _row("annotations", rollout_id="c", critiqued=False, status="skipped"),
    ]
    write_table(rollouts, "rollouts", partition_dir(tmp_path, "rollouts", 1))
    write_table(annotations, "annotations", partition_dir(tmp_path, "annotations", 1))
    (entry,) = critic_rounds(tmp_path, "sentiment")
    assert entry["critiqued"] == 2
    assert entry["status_share"] == {"ok": 0.5, "truncated": 0.5}
    assert entry["proposed_per_answer"] == 1.5 and entry["kept_spans_per_answer"] == 1.0
    assert entry["in_response_share"] == pytest.approx(2 / 3)
    silver = entry["vader_silver"]  # VADER spans of a: "great" (positive), "awful" (negative); b: none
    assert silver["silver_spans"] == 2 and silver["kept_spans"] == 2
    assert silver["span_precision"] == 0.5 and silver["span_recall"] == 0.5
    # char F1: a marks 13 characters (5 of them "great"), its silver 10 -> 2 * 5 / (13 + 10); b: neither marks any -> 1
    assert silver["char_f1"] == pytest.approx((10 / 23 + 1) / 2)
    # everything = both labels over all of a (2 x 44 characters, 10 silver) -> 20 / 98; b has no silver span -> 0
    assert silver["baselines_char_f1"] == pytest.approx({"nothing": 0.5, "everything": 20 / 98 / 2})
    assert "vader_silver" not in critic_rounds(tmp_path, "toxicity")[0]


def test_paired_difference_by_hand(tmp_path):
    from benchmarks.smol_run import paired_difference

    def samples(rewards: dict) -> list[dict]:
        return [_row("eval_samples", policy=policy, prompt_id=prompt, sample=i, env_reward=r)
                for (policy, prompt), values in rewards.items() for i, r in enumerate(values)]

    a, b = tmp_path / "a" / "data", tmp_path / "b" / "data"
    write_table(samples({("final", "p1"): [1.0, 0.0], ("final", "p2"): [0.5, 0.5], ("final", "p3"): [0.0, 0.0]}),
                "eval_samples", partition_dir(a, "eval_samples", 1))
    write_table(samples({("final", "p1"): [0.0, 0.0], ("final", "p2"): [0.5, 0.5], ("final", "p3"): [0.5, 0.5]}),
                "eval_samples", partition_dir(b, "eval_samples", 1))
    result = paired_difference(a, b, "final", "final")
    # per-prompt differences 0.5, 0, -0.5: mean 0, sample std 0.5, 95% interval 1.96 * 0.5 / sqrt(3)
    assert result["prompts"] == 3 and result["mean"] == pytest.approx(0.0)
    assert result["ci95"] == pytest.approx(1.96 * 0.5 / 3 ** 0.5)
    assert result["a"] == "a:final" and result["b"] == "b:final"


def test_stage_seconds_names_a_log_without_timestamps(tmp_path):
    log = tmp_path / "plain.log"
    log.write_text("Running stage 'rollout@0001':\n")
    with pytest.raises(SystemExit, match="plain.log has no timestamped lines"):
        stage_seconds(log)


def test_a_run_reproduced_only_to_its_first_critique_reports_no_curve_or_evaluation(tmp_path):
    from benchmarks.smol_run import report

    response = "A great film."
    write_table([_row("rollouts", rollout_id="a", response=response)], "rollouts",
                partition_dir(tmp_path / "data", "rollouts", 1))
    write_table([_row("annotations", rollout_id="a", critiqued=True, status="ok",
                      items=[{"label": "positive", "text": "great"}], spans=[_span("positive", "great", response)])],
                "annotations", partition_dir(tmp_path / "data", "annotations", 1))
    (tmp_path / "params.yaml").write_text(
        "run: {run_id: t, task: sentiment, seed: 0}\ncritic: {enabled: true}\nrollout: {batch_size: 1}\n"
        "rounds: {'0001': {prev: base}}\nevaluate: {policy: round=0001}\n")
    result = report(tmp_path, None, 5)
    assert result["reward_curve"] is None and result["evaluation"] is None and result["samples"] is None
    assert result["critic_rounds"][0]["vader_silver"]["span_precision"] == 1.0
