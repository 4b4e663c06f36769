"""DDP for the value-free algorithms: the ppo stage under a real 2-process `accelerate launch` (torchrun + gloo on
CPU) makes the one-process update, with groups of 2 (tests/test_distributed.py's check, on grouped tables); FSDP2
too. DeepSpeed ZeRO runs the same path (tests/test_deepspeed.py, with the optional extra); without deepspeed a
ZeRO launch of a value-free round is refused before it trains, by accelerate's launcher or by drlc's stage."""
from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
import yaml

from pipeline.core import store
from pipeline.model.policy import load_policy
from tests import test_distributed
from tests.e2e import tiny_params
from tests.test_resume import PARAMS, SEED, round_tables, save_tiny_base


def write_grouped_round(tmp: Path, base: dict | None = None, **ppo) -> tuple[Path, dict]:
    """test_distributed.write_round with rollout.samples_per_prompt 2 and each rollout's sample_index."""
    save_tiny_base(tmp / "base")
    raw = tiny_params(n_rounds=1, critic={"enabled": False}, ppo=ppo, base=base or {},
                      rollout={"samples_per_prompt": 2})
    raw["run"].update(seed=SEED, run_id="dp")
    (tmp / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    policy, _ = load_policy(tmp / "base", seed=SEED)
    for table, rows in zip(("rollouts", "scores", "annotations"), round_tables(policy, 1)):
        rows = [{"run_id": "dp", "round": 1, **row, **test_distributed.FILLER[table],
                 **({"group_index": i // 2, "sample_index": i % 2} if table == "rollouts" else {})}
                for i, row in enumerate(rows)]
        store.write_table(rows, table, tmp / table)
    return tmp / "params.yaml", {table: store.read_table(tmp / table, table) for table in test_distributed.FILLER}


@pytest.mark.slow  # a 2-process accelerate launch (about 45 s)
@pytest.mark.parametrize(("algorithm", "loss_type"), [("grpo", "grpo"), ("grpo", "dapo"), ("rloo", "grpo")])
def test_two_processes_make_the_one_process_update(tmp_path, monkeypatch, algorithm, loss_type):
    monkeypatch.setattr(test_distributed, "write_round", write_grouped_round)
    params = dataclasses.replace(PARAMS, algorithm=algorithm, loss_type=loss_type, vf_coef=0.0)
    one, launch = test_distributed.assert_two_processes_match_one(tmp_path, params)
    assert "FSDP2 over" not in launch.stderr and all(row["value_loss"] == 0 for row in one)
    assert not (tmp_path / "two" / "value_head.safetensors").exists()


@pytest.mark.slow  # a 2-process accelerate launch under FSDP2
def test_fsdp2_makes_the_one_process_grpo_update(tmp_path, monkeypatch):
    fsdp2 = Path(test_distributed.ROOT) / "configs" / "accelerate" / "fsdp2.yaml"
    monkeypatch.setattr(test_distributed, "write_round", write_grouped_round)
    params = dataclasses.replace(PARAMS, algorithm="grpo", loss_type="dapo", vf_coef=0.0)
    one, launch = test_distributed.assert_two_processes_match_one(tmp_path, params, config=fsdp2)
    assert "FSDP2 over" in launch.stderr and all(row["value_loss"] == 0 for row in one)


@pytest.mark.slow  # two failed 2-process launches (about 15 s)
@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is not None,
                    reason="deepspeed is installed: value-free ZeRO launches run in tests/test_deepspeed.py")
def test_a_zero_launch_of_a_grpo_round_without_deepspeed_is_refused_naming_it(tmp_path):
    zero2 = Path(test_distributed.ROOT) / "configs" / "accelerate" / "zero2.yaml"
    params, _ = write_grouped_round(tmp_path, **dataclasses.replace(PARAMS, algorithm="grpo", vf_coef=0.0).__dict__)
    # accelerate's launcher reads distributed_type: DEEPSPEED and stops before any process starts
    launched = test_distributed.launch_stage(tmp_path, params, "two", config=zero2)
    assert launched.returncode != 0 and "DeepSpeed is not installed" in launched.stderr.splitlines()[-1]
    # a launcher that sets accelerate's variable itself (here torchrun): each rank's stage refuses in one line, exit 2
    launched = test_distributed.launch_stage(tmp_path, params, "two", torchrun_env={"ACCELERATE_USE_DEEPSPEED": "true"})
    refusals = {line for line in launched.stderr.splitlines() if line.startswith("drlc: error:")}
    assert launched.returncode != 0 and "exitcode  : 2" in launched.stderr, launched.stderr[-2000:]
    expected = ("drlc: error: The launch config asks for DeepSpeed (distributed_type: DEEPSPEED) but deepspeed "
                "is not installed: pip install -c constraints.txt -e '.[deepspeed]', or launch with "
                "configs/accelerate/fsdp2.yaml.")
    # both ranks write to one stderr, so their two lines can interleave mid-line (seen once in a full run): each
    # refusal line is the expected one, or the start of it with the other rank's text run into it
    assert refusals and all(line == expected or line.startswith(expected[:40]) for line in refusals), refusals
    assert not (tmp_path / "two").exists() and not (tmp_path / "two-steps").exists()
