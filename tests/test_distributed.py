"""Data-parallel PPO: the `ppo` stage under `accelerate launch` with 2 CPU processes (gloo, DDP).

The 2-process round must make the update one process makes on the same global batch: same
ppo_steps rows and weights up to float summation order (each process scores half of every
minibatch, so padding widths, matmul blocking and reduction order differ).
Measured through accelerate's DDP (4 Adam steps, lr 3e-3, weights move up to 1.2e-2): weights differ
by <= 1e-7, except the attention key bias (8.5e-6): its exact gradient is 0 (softmax ignores a shift
that is the same for every key), so Adam divides float noise by noise there and the result is
arbitrary; it is checked loosely. A wrong scheme is far outside the bounds: averaging each
process's token mean instead of token-weighting them moved weights by 3.6e-3 and policy_loss by
1.5e-2; never syncing gradients (no_sync on every minibatch) gave grad_norm 2.55 for 3.71, and
dropping the sync after a skipped last minibatch changed the guarded run's stats by 0.3.
"""
from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from pipeline.core import store
from pipeline.core.config import load_params
from pipeline.core.errors import ConfigError, PPOInputError
from pipeline.model.policy import load_policy
from pipeline.steps.ppo_round import ppo_round
from pipeline.train.trainer import validate_batch
from tests.e2e import tiny_params
from tests.test_resume import PARAMS, SEED, as_batch, round_tables, save_tiny_base

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
WEIGHT_ATOL, KEY_BIAS_ATOL = 2e-6, 1e-4
STAT_RTOL, STAT_ATOL = 1e-4, 1e-6
KEY_BIAS = slice(32, 64)  # c_attn.bias = [query | key | value] biases, n_embd = 32 each
FILLER = {  # schema columns the ppo stage does not read
    "rollouts": {"prompt_id": "p", "query": "q", "response": "r", "seed": 0, "max_new_tokens": 6, "policy": "base"},
    "scores": {"scorer": "toy", "scorer_version": "1"},
    "annotations": {"critiqued": True, "status": "ok", "cache_key": "k", "cache_hit": False, "critic_model": "m",
                    "template_sha": "s", "raw_text": "", "spans": [], "prompt_tokens": 0, "completion_tokens": 0,
                    "cost_usd": 0.0, "error": None, "items": [], "dropped": [], "attempts": 0},
}


def write_round(tmp: Path, base: dict | None = None, **ppo) -> tuple[Path, dict]:
    """A params file (seed SEED, the given ppo and base settings) and round 1's three tables from the base."""
    save_tiny_base(tmp / "base")
    raw = tiny_params(n_rounds=1, critic={"enabled": False}, ppo={**PARAMS.__dict__, **ppo}, base=base or {})
    raw["run"].update(seed=SEED, run_id="dp")
    (tmp / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    policy, _ = load_policy(tmp / "base", seed=SEED)
    for table, rows in zip(("rollouts", "scores", "annotations"), round_tables(policy, 1)):
        rows = [{"run_id": "dp", "round": 1, **row, **FILLER[table]} for row in rows]
        store.write_table(rows, table, tmp / table)
    return tmp / "params.yaml", {table: store.read_table(tmp / table, table) for table in FILLER}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stage_command(tmp: Path, params: Path, out: str, policy: str = "base", round_: str = "0001") -> list[str]:
    """stages/ppo.py on the round write_round wrote into tmp, from tmp/`policy`, writing tmp/`out`*."""
    return ["stages/ppo.py", "--params", str(params), "--round", round_, "--policy", str(tmp / policy),
            "--reference", str(tmp / "base"), "--rollouts", str(tmp / "rollouts"), "--scores", str(tmp / "scores"),
            "--annotations", str(tmp / "annotations"), "--out", str(tmp / out), "--steps", str(tmp / f"{out}-steps"),
            "--kl-rewards", str(tmp / f"{out}-kl-rewards"), "--metrics", str(tmp / f"{out}.json")]


def launch_stage(tmp: Path, params: Path, out: str, processes: int = 2, config: Path | None = None,
                 policy: str = "base", round_: str = "0001", torchrun_env: dict | None = None
                 ) -> subprocess.CompletedProcess:
    """`accelerate launch --multi_gpu --num_processes N stages/ppo.py ...` (torchrun + gloo on CPU),
    or `accelerate launch --config_file CONFIG stages/ppo.py ...`, round `round_` from tmp/`policy`;
    torchrun_env: torchrun itself (`torch.distributed.run`, N processes) with these variables set instead."""
    how = (["--config_file", str(config)] if config else
           ["--multi_gpu", "--num_processes", str(processes), "--num_machines", "1", "--mixed_precision", "no",
            "--dynamo_backend", "no"])
    launcher = [sys.executable, "-m", "accelerate.commands.launch", *how, "--main_process_port", str(free_port())]
    if torchrun_env is not None:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
                    "--master_port", str(free_port())]
    stage = stage_command(tmp, params, out, policy=policy, round_=round_)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TQDM_DISABLE="1", CUDA_VISIBLE_DEVICES="", **(torchrun_env or {}))
    return subprocess.run(launcher + stage, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # a 2-process accelerate launch (about 45 s)
def test_two_processes_make_the_one_process_update(tmp_path):
    _, launch = assert_two_processes_match_one(tmp_path, PARAMS)
    assert "FSDP2 over" not in launch.stderr  # a plain launch is DDP: nothing sharded


@pytest.mark.slow  # a 2-process accelerate launch (about 45 s)
def test_two_processes_match_one_when_the_ratio_guard_skips_minibatches(tmp_path):
    """Skipped minibatches (the step's last one too) must still leave DDP's all-reduce finished and equal."""
    guarded = PARAMS.__class__(**{**PARAMS.__dict__, "ratio_threshold": 1.0005})
    one, _ = assert_two_processes_match_one(tmp_path, guarded)
    assert [row["skipped"] for row in one] == [False, True, True, True]


@pytest.mark.slow  # a 2-process accelerate launch (about 45 s)
def test_two_processes_match_one_with_a_lora_policy(tmp_path):
    """DDP over the adapters and value head; the reference is the same prepared policy, adapters off."""
    lora = {"lora_r": 4, "lora_alpha": 8.0, "lora_target_modules": ["c_attn"]}
    one, _ = assert_two_processes_match_one(tmp_path, PARAMS, lora)
    assert not any(row["skipped"] for row in one)


def assert_two_processes_match_one(tmp_path, params_one, lora: dict | None = None, config: Path | None = None):
    """Launch the stage on 2 processes (`config`: an accelerate file, else plain DDP), run it in this one;
    compare rows, weights, Adam; return the rows and the launch's result."""
    params, tables = write_round(tmp_path, base=lora, **params_one.__dict__)
    base = load_params(params).base
    started = time.perf_counter()
    result = launch_stage(tmp_path, params, "two", config=config)
    launched_s = time.perf_counter() - started
    assert result.returncode == 0, result.stderr[-3000:]

    one = ppo_round(tables["rollouts"], tables["scores"], tables["annotations"], policy_dir=str(tmp_path / "base"),
                    reference_dir=str(tmp_path / "base"), out_dir=str(tmp_path / "one"), params=params_one,
                    run_id="dp", round_=1, seed=SEED, base=base)
    two = store.read_table(tmp_path / "two-steps", "ppo_steps")
    assert len(two) == len(one) == params_one.ppo_epochs * 16 // params_one.backward_batch_size
    for row_one, row_two in zip(one, two):
        for column, value in row_one.items():
            if isinstance(value, float) and column != "tokens_per_s":
                assert row_two[column] == pytest.approx(value, rel=STAT_RTOL, abs=STAT_ATOL), column
            elif column != "tokens_per_s":
                assert row_two[column] == value, column
    weights_one, weights_two = (load_policy(tmp_path / name, seed=0)[0].state_dict() for name in ("one", "two"))
    start = load_policy(tmp_path / "base", seed=SEED)[0].state_dict()
    key_bias = "lm.transformer.h.0.attn.c_attn.bias"
    diff = {k: (weights_one[k] - weights_two[k]).abs() for k in weights_one}
    key_bias_diff = diff[key_bias][KEY_BIAS].max().item() if key_bias in diff else 0.0
    if key_bias in diff:
        diff[key_bias][KEY_BIAS] = 0.0
    max_diff = max(d.max().item() for d in diff.values())
    moved = max((weights_one[k] - start[k]).abs().max().item() for k in weights_one if k in start)
    print(f"\n2-process launch {launched_s:.1f} s; max |w1 - w2| = {max_diff:.2e} "
          f"(attention key bias {key_bias_diff:.2e}); max |w1 - w0| = {moved:.2e}")
    assert max_diff < WEIGHT_ATOL and key_bias_diff < KEY_BIAS_ATOL < moved
    adam_one, adam_two = (torch.load(tmp_path / name / "optimizer.pt", weights_only=True)["state"]
                          for name in ("one", "two"))
    assert sorted(adam_one) == sorted(adam_two) and all(int(adam_one[k]["step"]) == int(adam_two[k]["step"]) for k in adam_one)
    assert (tmp_path / "one" / "trainer_state.json").read_text().count("round") == 1
    assert sorted(p.name for p in (tmp_path / "two-steps").iterdir()) == ["part-0.parquet"]
    return one, result


def test_minibatch_not_divisible_by_processes_raises_before_training(tmp_path):
    params, tables = write_round(tmp_path)
    odd = PARAMS.__class__(**{**PARAMS.__dict__, "mini_batch_size": 1, "gradient_accumulation_steps": 1})
    batch = as_batch(tables["rollouts"], tables["scores"], tables["annotations"])
    validate_batch(batch, odd, world_size=1)
    with pytest.raises(PPOInputError, match=r"ppo.mini_batch_size = 1 is not divisible by the 2 data-parallel"):
        validate_batch(batch, odd, world_size=2)


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is not None,
                    reason="deepspeed is installed: its launches run in tests/test_deepspeed.py")
def test_a_deepspeed_launch_without_deepspeed_is_refused_with_the_fix(monkeypatch):
    from pipeline.parallel.distributed import DataParallel

    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    assert DataParallel.from_environment() is None  # a plain single-process run needs no deepspeed
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=r"deepspeed is not installed: pip install .*'\.\[deepspeed\]'"):
        DataParallel.from_environment()


def test_deepspeed_settings_drlc_has_not_run_are_refused_and_its_own_are_set():
    """Offloading and DeepSpeed's fp16/bf16 are refused naming the key; accumulation, clipping and the
    micro-batch come from the ppo params (accelerate's plugin, as a launch config builds it)."""
    from accelerate.utils import DeepSpeedPlugin

    from pipeline.parallel.deepspeed_zero import _configure

    with pytest.raises(ConfigError, match=r"offload_optimizer = 'cpu' .* set offload_optimizer_device: none"):
        _configure(DeepSpeedPlugin(zero_stage=2, offload_optimizer_device="cpu"), max_grad_norm=1.0,
                   micro_batch_size=2, world_size=2)
    bf16 = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}})
    with pytest.raises(ConfigError, match=r"enables bf16; drlc's precision is ppo.mixed_precision"):
        _configure(bf16, max_grad_norm=None, micro_batch_size=2, world_size=2)
    plugin = DeepSpeedPlugin(zero_stage=3, gradient_accumulation_steps=4, gradient_clipping=1.0)
    assert _configure(plugin, max_grad_norm=None, micro_batch_size=2, world_size=2) == 3
    assert {key: plugin.deepspeed_config[key] for key in ("gradient_accumulation_steps", "gradient_clipping",
                                                           "managed_gradient_accumulation", "train_batch_size")} == \
        {"gradient_accumulation_steps": 1, "gradient_clipping": 0.0, "managed_gradient_accumulation": False,
         "train_batch_size": 4}
