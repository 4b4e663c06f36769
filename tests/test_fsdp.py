"""FSDP2 PPO: the `ppo` stage under `accelerate launch --config_file configs/accelerate/fsdp2.yaml`, 2 CPU processes.

accelerate 1.15 applies FSDP only on a GPU-family process group, so on CPU (gloo) drlc calls
`fully_shard` itself (pipeline.parallel.distributed). The launches check that the policy really is
sharded (the stage's "FSDP2 over 2 processes" line: every parameter of the policy and of a
separate reference a DTensor, about half of the elements on rank 0), that the update is the
one-process update at the DDP test's tolerance (tests/test_distributed.py), and that the
gathered checkpoint has the one-process layout and resumes in one process and under FSDP2.
Measured (4 Adam steps, weights move 1.2e-2): weights differ by 6.8e-8 from one process, the
attention key bias (exact gradient 0, see tests/test_distributed.py) by 1.0e-5. Without the
reshard after a skipped forward (DataParallel.skipped_forward), the root's weights stayed
unsharded past the optimizer step and the next forward used the stale ones: the guarded run's
third step had grad_norm 0.80 instead of 1.02.
"""
from __future__ import annotations

import re

import pytest
import torch
import yaml
from safetensors.torch import load_file

from pipeline.core.errors import ConfigError
from pipeline.model.policy import load_policy
from pipeline.steps.ppo_round import ppo_round
from tests.test_distributed import (
    KEY_BIAS,
    ROOT,
    WEIGHT_ATOL,
    assert_two_processes_match_one,
    launch_stage,
    write_round,
)
from tests.test_resume import PARAMS, SEED

pytestmark = pytest.mark.slow  # each test starts a 2-process accelerate launch (about 45 s)

FSDP2 = ROOT / "configs" / "accelerate" / "fsdp2.yaml"
KEY_BIAS_NAME = "lm.transformer.h.0.attn.c_attn.bias"


def assert_sharded(stderr: str, reference: bool = True) -> None:
    """Every parameter tensor of the policy (and of a separate reference) is a DTensor, and rank 0
    holds about half of the elements."""
    held = r"(\d+) of (\d+) parameter tensors sharded, (\d+) of (\d+) elements here"
    found = re.search(rf"FSDP2 over 2 processes: policy {held}; reference (?:{held}|the policy with adapters off)",
                      stderr)
    assert found, stderr[-2000:]
    print(f"\nrank 0: {found.group(0)}")
    counts = [int(n) for n in found.groups() if n is not None]
    assert len(counts) == (8 if reference else 4)
    for sharded, tensors, local, total in zip(*[iter(counts)] * 4):
        assert sharded == tensors > 0 and 0.4 * total < local < 0.6 * total


def max_weight_diff(a: dict, b: dict) -> float:
    """max |a - b| over the weights, the attention key bias left out (its value is float noise)."""
    diff = {k: (a[k] - b[k]).abs() for k in a}
    diff[KEY_BIAS_NAME][KEY_BIAS] = 0.0
    return max(d.max().item() for d in diff.values())


def test_fsdp2_makes_the_one_process_update_and_a_checkpoint_one_process_resumes(tmp_path):
    one_rows, launch = assert_two_processes_match_one(tmp_path, PARAMS, config=FSDP2)
    assert_sharded(launch.stderr)
    assert_one_process_layout(tmp_path)
    one = tmp_path / "one"

    # round 2 in this process from the FSDP2 checkpoint and from the one-process checkpoint, and
    # round 2 under FSDP2 from the one-process checkpoint (its Adam state loaded into the shards)
    resume_round_two(tmp_path, "fsdp", config=FSDP2)
    after = {s: load_policy(tmp_path / f"{s}-2", seed=0)[0].state_dict() for s in ("one", "two", "fsdp")}
    moved = max_weight_diff(after["one"], load_policy(one, seed=0)[0].state_dict())
    print(f"round 2: max |w1 - w| from the FSDP2 checkpoint {max_weight_diff(after['one'], after['two']):.2e}, "
          f"under FSDP2 {max_weight_diff(after['one'], after['fsdp']):.2e}; moved {moved:.2e}")
    assert max_weight_diff(after["one"], after["two"]) < WEIGHT_ATOL < moved
    assert max_weight_diff(after["one"], after["fsdp"]) < WEIGHT_ATOL
    adam = [torch.load(tmp_path / f"{s}-2" / "optimizer.pt", weights_only=True)["state"] for s in ("one", "fsdp")]
    assert all(int(adam[1][k]["step"]) == int(adam[0][k]["step"]) == 8 for k in adam[0])  # 4 + 4 Adam steps
    assert len(one_rows) == 4


def test_fsdp2_matches_one_process_when_the_ratio_guard_skips_minibatches(tmp_path):
    """Skipped forwards (the step's last one too) leave no unsharded root weights behind."""
    guarded = PARAMS.__class__(**{**PARAMS.__dict__, "ratio_threshold": 1.0005})
    rows, launch = assert_two_processes_match_one(tmp_path, guarded, config=FSDP2)
    assert [row["skipped"] for row in rows] == [False, True, True, True]
    assert_sharded(launch.stderr)


def test_fsdp2_matches_one_process_with_a_lora_policy(tmp_path):
    """Adapters and value head train sharded; the reference is the sharded policy with adapters off."""
    lora = {"lora_r": 4, "lora_alpha": 8.0, "lora_target_modules": ["c_attn"]}
    rows, launch = assert_two_processes_match_one(tmp_path, PARAMS, lora, config=FSDP2)
    assert not any(row["skipped"] for row in rows)
    assert_sharded(launch.stderr, reference=False)


def test_fsdp_version_1_is_refused_with_the_fix(monkeypatch):
    from pipeline.parallel.distributed import DataParallel

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "1")
    with pytest.raises(ConfigError, match=r"FSDP version 1 .*fsdp_version: 2"):
        DataParallel.from_environment()
    monkeypatch.setenv("FSDP_VERSION", "2")
    assert DataParallel.from_environment() is None  # one process: FSDP2 config or not, a plain run


def test_fsdp2_matches_one_process_with_shared_lower_layers(tmp_path):
    """ppo.num_shared_layers: the frozen shared embeddings are sharded in the policy and again in the reference."""
    shared = PARAMS.__class__(**{**PARAMS.__dict__, "num_shared_layers": 0})
    rows, launch = assert_two_processes_match_one(tmp_path, shared, config=FSDP2)
    assert not any(row["skipped"] for row in rows)
    assert_sharded(launch.stderr)


def resume_round_two(tmp_path, name: str, *, config: str) -> None:
    """Round 2 in this process from the one- and the two-process checkpoints (into one-2, two-2),
    and round 2 launched with the accelerate `config` from the one-process checkpoint (into <name>-2)."""
    _, tables = write_round(tmp_path / "again")
    for start in ("one", "two"):
        ppo_round(tables["rollouts"], tables["scores"], tables["annotations"], policy_dir=str(tmp_path / start),
                  reference_dir=str(tmp_path / "base"), out_dir=str(tmp_path / f"{start}-2"), params=PARAMS,
                  run_id="dp", round_=2, seed=SEED)
    raw = yaml.safe_load((tmp_path / "params.yaml").read_text())
    raw["rounds"]["0002"] = {"prev": "round=0001"}
    raw["evaluate"]["policy"] = "round=0002"
    (tmp_path / "params-2.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    launch = launch_stage(tmp_path, tmp_path / "params-2.yaml", f"{name}-2", config=config, policy="one", round_="0002")
    assert launch.returncode == 0, launch.stderr[-3000:]


def assert_one_process_layout(tmp_path) -> None:
    """The 2-process checkpoint has the one-process files, tensor names and Adam state."""
    one, two = tmp_path / "one", tmp_path / "two"
    assert sorted(p.name for p in one.iterdir()) == sorted(p.name for p in two.iterdir())
    for name in (p.name for p in one.iterdir() if p.suffix == ".safetensors"):
        assert sorted(load_file(one / name)) == sorted(load_file(two / name)), name  # one tied head, not two
    adam_one, adam_two = (torch.load(folder / "optimizer.pt", weights_only=True) for folder in (one, two))
    assert adam_one["param_groups"] == adam_two["param_groups"]
    assert sorted(adam_one["state"]) == sorted(adam_two["state"])
    for index, state in adam_one["state"].items():
        assert sorted(state) == sorted(adam_two["state"][index])
        for key, value in state.items():
            torch.testing.assert_close(adam_two["state"][index][key], value, rtol=1e-4, atol=1e-6)
