"""`drlc estimate` with rollout.engine vllm: vLLM's batching, tensor parallelism and start, by hand (issue 39).

The same made-up device as tests/test_runtime_estimate.py (1 TFLOP/s peak, MFU 0.5, 100 GB/s, 1 ms per layer
per call), so every term is decimal arithmetic.
"""
from dataclasses import replace
from pathlib import Path

import pytest

from pipeline.commands.runtime import VLLM_START_S, PolicyShape, rollout_s
from pipeline.core.config import load_params
from pipeline.model.throughput import Throughput

ROOT = Path(__file__).resolve().parents[1]
DEVICE = Throughput("cpu", flops=1e12, mfu=0.5, memory_bandwidth=100e9, call_overhead_s=1e-3,
                    process_start_s=3.0, dvc_stage_s=1.0, source="test")
SHAPE = PolicyShape(params=1_000_000, layers=10, hidden=64, dtype_bytes=4)


def params_with(rounds_per_stage: int = 1, **rollout):
    params = load_params(ROOT / "params.yaml")
    return replace(params, rollout=replace(params.rollout, batch_size=128, generation_batch_size=64,
                                           max_new_tokens=20, **rollout),
                   run=replace(params.run, rounds_per_stage=rounds_per_stage))


def test_vllm_batches_every_request_at_once_and_adds_its_start():
    # drlc: 2 generation batches of 64 (tests/test_runtime_estimate.py); vLLM: 1 batch of 128 (max_num_seqs 256),
    # compute-bound steps 2e6 x 128 / 0.5e12 = 512 us + 10 ms, prefill 2e6 x 128 x 3.5 / 0.5e12 + 10 ms
    step, prefill = 2e6 * 128 / 0.5e12 + 0.010, 2e6 * 128 * 3.5 / 0.5e12 + 0.010
    vllm = params_with(engine="vllm")
    assert rollout_s(vllm, SHAPE, DEVICE, 3.5) == pytest.approx(VLLM_START_S["cpu"] + prefill + 20 * step)
    # inside a chunk of 4 rounds the start is shared: a quarter per round; eager starts faster
    chunk = params_with(4, engine="vllm", vllm_args={"enforce_eager": True})
    assert rollout_s(chunk, SHAPE, DEVICE, 3.5) == pytest.approx(VLLM_START_S["cpu_eager"] / 4 + prefill + 20 * step)


def test_vllm_max_num_seqs_and_tensor_parallel_devices():
    # max_num_seqs 32: 4 batches of 32; tensor_parallel_size 2 halves weights, KV and FLOPs per device
    params = params_with(engine="vllm", vllm_args={"max_num_seqs": 32, "tensor_parallel_size": 2})
    step = max((4e6 + 2 * 10 * 64 * 13.5 * 32 * 4) / 2 / 100e9, 1e6 * 32 / 0.5e12) + 0.010
    prefill = 2e6 * 32 * 3.5 / 0.5e12 / 2 + 0.010 / 2
    assert rollout_s(params, SHAPE, DEVICE, 3.5) == pytest.approx(VLLM_START_S["cpu"] + 4 * (prefill + 20 * step))
