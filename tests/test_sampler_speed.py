"""benchmarks/sampler_speed.py at a tiny size: report fields and token counts (no timing assertions)."""
import json
from pathlib import Path

from benchmarks.sampler_speed import run_benchmark

ROOT = Path(__file__).resolve().parents[1]

TINY = {"tiny": dict(vocab_size=300, n_layer=1, n_head=2, n_embd=32, n_positions=64)}


def test_sampler_speed_tiny():
    report = run_benchmark(TINY, batch=4, query_len=8, max_new_tokens=5, repeats=2)
    json.dumps(report, sort_keys=True)  # serialisable as written
    assert report["threads"] == 2 and len(report["load_avg_before"]) == 3 and len(report["load_avg_after"]) == 3
    r = report["results"]["tiny"]
    assert r["produced_shape"] == {"drlc": [4, 5], "generate": [4, 5]}
    assert r["new_tokens_per_call"] == 20
    for key in ("drlc", "generate"):
        assert len(r["seconds"][key]) == 2 and r["tokens_per_s"][key] > 0
    assert r["ratio_drlc_over_generate"] > 0
    check = r["agreement"]
    assert check["drlc_rescore_max_abs_diff"] < 1e-4 and check["generate_rescore_max_abs_diff"] < 1e-4
    assert set(check) >= {"drlc_mean_logprob", "generate_mean_logprob", "mean_logprob_z"}
