"""`drlc estimate`'s run time: each formula against a hand computation, and --calibrate on a real model.

Hand numbers use a made-up device (1 TFLOP/s peak, MFU 0.5, 100 GB/s, 1 ms per layer per call,
3 s process start, 1 s of DVC) so every term is visible in decimal arithmetic.
"""
from __future__ import annotations

import argparse
import re
from dataclasses import replace
from pathlib import Path

import pytest

from pipeline.commands.estimate import add_estimate_parser
from pipeline.commands.runtime import PolicyShape, estimate_run_time, ppo_s, rollout_s
from pipeline.core.config import load_params
from pipeline.model.throughput import ASSUMED, Throughput, decode_step_s, forward_s, kv_bytes, train_step_s

ROOT = Path(__file__).resolve().parents[1]
DEVICE = Throughput("cpu", flops=1e12, mfu=0.5, memory_bandwidth=100e9, call_overhead_s=1e-3,
                    process_start_s=3.0, dvc_stage_s=1.0, source="test")


def test_forward_and_train_step_by_hand():
    # 2 x 1e6 params x 1000 tokens = 2e9 FLOP at 0.5e12 FLOP/s = 4 ms, + 10 layers x 1 ms
    assert forward_s(DEVICE, 1_000_000, 1000, 10) == pytest.approx(0.004 + 0.010)
    # 6 x 1e6 x 1000 = 6e9 FLOP = 12 ms, + 3 calls' overhead x 10 layers x 1 ms
    assert train_step_s(DEVICE, 1_000_000, 1000, 10) == pytest.approx(0.012 + 0.030)


def test_kv_bytes_and_decode_step_are_memory_bound_by_hand():
    # keys + values x 10 layers x 64 hidden x 50 positions x 8 sequences x 4 bytes = 2,048,000
    assert kv_bytes(10, 64, 50, 8, 4) == 2_048_000
    # (4 MB weights + 2.048 MB KV) / 100 GB/s = 60.48 us; compute 2 x 1e6 x 8 / 0.5e12 = 32 us: memory wins
    assert decode_step_s(DEVICE, 1_000_000, 4_000_000, 2_048_000, 8, 10) == pytest.approx(60.48e-6 + 0.010)
    # a batch of 1024 makes it compute-bound: 2 x 1e6 x 1024 / 0.5e12 = 4.096 ms
    assert decode_step_s(DEVICE, 1_000_000, 4_000_000, 0, 1024, 10) == pytest.approx(4.096e-3 + 0.010)


def _demo(**rollout):
    params = load_params(ROOT / "params.yaml")
    return replace(params, rollout=replace(params.rollout, **rollout)) if rollout else params


def test_rollout_and_ppo_stage_by_hand():
    params = _demo(batch_size=128, generation_batch_size=64, max_new_tokens=20)
    shape = PolicyShape(params=1_000_000, layers=10, hidden=64, dtype_bytes=4)
    query = 3.5
    # 2 batches of 64; prefill 2e6 x 224 tokens / 0.5e12 + 10 ms; 20 decoding steps, each reading
    # 4e6 + KV(13.5 positions) = 4,442,368 bytes in 44.4 us, but computing 2e6 x 64 FLOP in 256 us: compute-bound
    assert (4e6 + 2 * 10 * 64 * 13.5 * 64 * 4) / 100e9 < 2e6 * 64 / 0.5e12
    step = 2e6 * 64 / 0.5e12 + 0.010
    prefill = 2e6 * 64 * 3.5 / 0.5e12 + 0.010
    assert rollout_s(params, shape, DEVICE, query) == pytest.approx(2 * (prefill + 20 * step))
    # ppo: 128 / 16 = 8 minibatches of 16 x 23.5 tokens; 2 no-grad forwards each, then 4 epochs of training steps
    tokens = 16 * 23.5
    forward = 2e6 * tokens / 0.5e12 + 0.010
    train = 6e6 * tokens / 0.5e12 + 0.030
    assert params.ppo.ppo_epochs == 4 and params.ppo.mini_batch_size == 16
    assert ppo_s(params, shape, DEVICE, 23.5) == pytest.approx(2 * 8 * forward + 4 * 8 * train)


def test_run_time_adds_processes_critic_and_io():
    params = _demo()
    shape = PolicyShape(params=1_000_000, layers=10, hidden=64, dtype_bytes=4)
    run = estimate_run_time(params, shape, DEVICE, query=3.5, response=20, critic_calls=128,
                            critic_latency_s=0.5, io_s=7.0)
    # critique: a process (3 + 1 s) + 128 calls x 0.5 s / max_concurrency 8 = 8 s
    assert run.stages["critique"] == pytest.approx(4.0 + 128 * 0.5 / params.critic.max_concurrency)
    assert run.stages["score"] == pytest.approx(4.0)  # VADER: no model
    assert run.run_s == pytest.approx(len(params.rounds) * sum(run.stages.values()) + 7.0)


def test_each_stage_counts_its_model_loads_and_ppo_its_checkpoint_write():
    params = _demo()
    shape = PolicyShape(params=1_000_000, layers=10, hidden=64, dtype_bytes=4)
    device = replace(DEVICE, load_call_s=0.5, load_bps=1e9, write_bps=0.5e9, stage_start_s={"critique": 5.0})
    plain = estimate_run_time(params, shape, device, query=3.5, response=20, critic_calls=0, critic_latency_s=0.5)
    loads = {"rollout": {"models/round=1": 1e9}, "score": {}, "ppo": {"models/round=1": 2e9, "models/base": 1e9}}
    run = estimate_run_time(params, shape, device, query=3.5, response=20, critic_calls=0, critic_latency_s=0.5,
                            loads=loads, checkpoint_bytes=1e9)
    # rollout: one folder, 0.5 s + 1 GB at 1 GB/s; ppo: two folders, 2 x 0.5 s + 3 GB, and writes 1 GB at 0.5 GB/s
    assert run.stages["rollout"] - plain.stages["rollout"] == pytest.approx(0.5 + 1.0)
    assert run.stages["ppo"] - plain.stages["ppo"] == pytest.approx(2 * 0.5 + 3.0 + 2.0)
    assert run.stages["score"] == plain.stages["score"] == pytest.approx(3.0 + 1.0)  # no model: start + DVC
    assert run.stages["critique"] == pytest.approx(5.0 + 1.0)  # its own measured start, + DVC


def test_the_score_stage_counts_building_its_reward():
    from pipeline.commands.runtime import measured_scorer_setup_s

    params = _demo()
    shape = PolicyShape(params=1_000_000, layers=10, hidden=64, dtype_bytes=4)
    plain = estimate_run_time(params, shape, DEVICE, query=3.5, response=20, critic_calls=0, critic_latency_s=0.5)
    built = estimate_run_time(params, shape, DEVICE, query=3.5, response=20, critic_calls=0, critic_latency_s=0.5,
                              scorer_setup_s=2.0)
    assert built.stages["score"] - plain.stages["score"] == pytest.approx(2.0)
    assert measured_scorer_setup_s(params) > 0  # VADER's analyzer built by the task's own make_reward
    for scorer, model in (("hf_classifier", "some/hub-model"), ("perspective", None)):
        toxic = replace(params, run=replace(params.run, task="toxicity"),
                        score=replace(params.score, scorer=scorer, model=model))
        assert measured_scorer_setup_s(toxic) == 0.0  # a model (counted with the loads) or the network: not built


def test_stated_assumptions_are_named_in_the_report(capsys):
    parser = argparse.ArgumentParser(prog="drlc")
    add_estimate_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["estimate", str(ROOT / "configs/paper/sentiment-dense.yaml"), "--root", str(ROOT),
                              "--dvc-file", str(ROOT / "dvc.yaml"), "--set", "run.device=cuda"])
    args.func(args)
    out = capsys.readouterr().out.split("== run time", 1)[1]
    cuda = ASSUMED["cuda"]
    assert f"{cuda.flops / 1e12:g} TFLOP/s peak x MFU {cuda.mfu:g}" in out
    assert f"memory-bound at {cuda.memory_bandwidth / 1e9:g} GB/s" in out and "STATED" in out


@pytest.mark.slow
def test_calibrate_measures_the_demo_policy_and_says_so(capsys):
    """--calibrate times a real tiny GPT-2 (the demo's base.* shape) on the CPU: measured, positive, in the output."""
    parser = argparse.ArgumentParser(prog="drlc")
    add_estimate_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["estimate", str(ROOT / "params.yaml"), "--root", str(ROOT), "--dvc-file",
                              str(ROOT / "dvc.yaml"), "--set", "run.device=cpu", "--calibrate"])
    args.func(args)
    out = capsys.readouterr().out.split("== run time", 1)[1]
    assert "MEASURED on this machine (--calibrate)" in out and "STATED" not in out
    assert re.search(r"stage process start rollout [\d.]+ s, score [\d.]+ s, critique [\d.]+ s, ppo [\d.]+ s", out)
    assert re.search(r"model load [\d.]+ s \+ [\d.]+ GB/s, write [\d.]+ GB/s", out)
    line = re.search(r"per round: (.+)", out)[1]
    per_round = [float(seconds) for _, seconds in re.findall(r"(rollout|ppo) ([\d.]+) s", line)]
    assert len(per_round) == 2 and all(seconds > 0 for seconds in per_round)
