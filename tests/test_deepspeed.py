"""DeepSpeed ZeRO PPO: the `ppo` stage under `accelerate launch --config_file configs/accelerate/zero{1,2,3}.yaml`,
2 CPU processes (gloo; deepspeed's CPU accelerator, its shared-memory comm op built on first use).

deepspeed is an optional extra (`pip install -c constraints.txt -e '.[deepspeed]'`, not in CI);
without it these tests skip. The first launch on a machine builds the comm op (about 150 s here).
The launches check that ZeRO really partitions (the stage's "DeepSpeed ZeRO-k over 2 processes"
line: Adam's state over about half of the trainable elements on rank 0; under ZeRO-3 with
`stage3_param_persistence_threshold: 0` every parameter of the policy and of the separate
reference partitioned, about half of its elements on rank 0), that the update is the one-process
update at the DDP test's tolerance (tests/test_distributed.py), also with skipped minibatches,
clipping, LoRA and shared layers, and that the gathered checkpoint has the one-process layout and
resumes in one process and under ZeRO; a value-free round (grpo, groups of 2, no value head) makes its one-process
update too. Measured numbers: docs/scale-out.md, "DeepSpeed ZeRO-1/2/3".
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import re

import pytest
import torch
import yaml

from pipeline.model.policy import load_policy
from tests.test_distributed import ROOT, WEIGHT_ATOL, assert_two_processes_match_one
from tests.test_fsdp import assert_one_process_layout, max_weight_diff, resume_round_two
from tests.test_resume import PARAMS

NOT_INSTALLED = "deepspeed is not installed (optional: pip install -c constraints.txt -e '.[deepspeed]')"
pytestmark = [pytest.mark.slow,  # each test starts a 2-process accelerate launch (20-60 s)
              pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason=NOT_INSTALLED)]

ZERO = {stage: ROOT / "configs" / "accelerate" / f"zero{stage}.yaml" for stage in (1, 2, 3)}


def zero3_unpersisted(tmp_path):
    """zero3.yaml with a DeepSpeed config file whose stage3_param_persistence_threshold is 0: the tiny
    test model's parameters are all below DeepSpeed's default threshold (1e5 elements), which
    keeps such parameters whole on every process."""
    launch = yaml.safe_load(ZERO[3].read_text())
    ds_config = {"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
                 "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"}
    (tmp_path / "ds_zero3.json").write_text(json.dumps(ds_config))
    launch.pop("mixed_precision")  # accelerate refuses it beside a DeepSpeed config file
    launch["deepspeed_config"] = {"deepspeed_config_file": str(tmp_path / "ds_zero3.json"), "zero3_init_flag": False}
    (tmp_path / "zero3.yaml").write_text(yaml.safe_dump(launch))
    return tmp_path / "zero3.yaml"


def assert_partitioned(stderr: str, stage: int, policy: str, reference: str | None) -> None:
    """Rank 0 holds Adam's state for about half of the trainable elements. policy: "partitioned" (every
    parameter, about half of its elements here) or "whole" (none partitioned, all elements here);
    reference: "partitioned", "replicated", "the policy with adapters off" or None (not checked)."""
    held = r"(\d+) of (\d+) parameter tensors partitioned, (\d+) of (\d+) elements here"
    found = re.search(rf"DeepSpeed ZeRO-{stage} over 2 processes: Adam state over (\d+) of (\d+) elements here; "
                      rf"policy {held}; reference (?:{held}|replicated|the policy with adapters off)", stderr)
    assert found, stderr[-3000:]
    print(f"\nrank 0: {found.group(0)}")
    counts = [int(n) if n is not None else None for n in found.groups()]
    adam_here, adam_total = counts[:2]
    assert 0.4 * adam_total < adam_here < 0.6 * adam_total
    units = {"policy": (policy, counts[2:6])}
    if reference == "partitioned":
        units["reference"] = (reference, counts[6:10])
    elif reference is not None:
        assert counts[6] is None and found.group(0).endswith(reference), found.group(0)
    for name, (kind, (partitioned, tensors, local, total)) in units.items():
        if kind == "partitioned":
            assert partitioned == tensors > 0 and 0.4 * total < local < 0.6 * total, name
        else:
            assert partitioned == 0 and local == total > 0, name


@pytest.mark.parametrize("stage", [2, 1, 3])
def test_zero_makes_the_one_process_update_and_a_checkpoint_one_process_resumes(tmp_path, stage):
    _, launch = assert_two_processes_match_one(tmp_path, PARAMS, config=ZERO[stage])
    assert_partitioned(launch.stderr, stage, policy="whole", reference="replicated" if stage < 3 else None)
    assert_one_process_layout(tmp_path)

    # round 2 in this process from the ZeRO checkpoint and from the one-process checkpoint, and
    # round 2 under ZeRO from the one-process checkpoint (its Adam state set into the partitions)
    resume_round_two(tmp_path, "zero", config=ZERO[stage])
    after = {s: load_policy(tmp_path / f"{s}-2", seed=0)[0].state_dict() for s in ("one", "two", "zero")}
    moved = max_weight_diff(after["one"], load_policy(tmp_path / "one", seed=0)[0].state_dict())
    print(f"round 2: max |w1 - w| from the ZeRO-{stage} checkpoint {max_weight_diff(after['one'], after['two']):.2e}, "
          f"under ZeRO-{stage} {max_weight_diff(after['one'], after['zero']):.2e}; moved {moved:.2e}")
    assert max_weight_diff(after["one"], after["two"]) < WEIGHT_ATOL < moved
    assert max_weight_diff(after["one"], after["zero"]) < WEIGHT_ATOL
    adam = [torch.load(tmp_path / f"{s}-2" / "optimizer.pt", weights_only=True)["state"] for s in ("one", "zero")]
    assert all(int(adam[1][k]["step"]) == int(adam[0][k]["step"]) == 8 for k in adam[0])  # 4 + 4 Adam steps


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_makes_the_one_process_grpo_update_with_no_value_head(tmp_path, monkeypatch, stage):
    """The value-free path under ZeRO: the engine wraps a policy without a value head (nothing in
    pipeline/parallel/deepspeed_zero.py depends on one), on grouped tables (tests/test_value_free_distributed.py)."""
    from tests import test_distributed
    from tests.test_value_free_distributed import write_grouped_round

    monkeypatch.setattr(test_distributed, "write_round", write_grouped_round)
    params = dataclasses.replace(PARAMS, algorithm="grpo", loss_type="dapo", vf_coef=0.0)
    rows, launch = assert_two_processes_match_one(tmp_path, params, config=ZERO[stage])
    assert f"DeepSpeed ZeRO-{stage} over 2 processes" in launch.stderr
    assert all(row["value_loss"] == 0 for row in rows)
    assert not (tmp_path / "two" / "value_head.safetensors").exists()


def test_zero3_partitions_policy_and_reference_and_makes_the_one_process_update(tmp_path):
    _, launch = assert_two_processes_match_one(tmp_path, PARAMS, config=zero3_unpersisted(tmp_path))
    assert_partitioned(launch.stderr, 3, policy="partitioned", reference="partitioned")
    assert_one_process_layout(tmp_path)


@pytest.mark.parametrize("stage", [3, 1])
def test_zero_matches_one_process_when_the_ratio_guard_skips_minibatches(tmp_path, stage):
    """Skipped forwards (the step's last one too): the engine's step still reduces what the earlier
    minibatches accumulated (ZeRO-1 reduces only there; ZeRO-3 reduce-scatters in each backward)."""
    guarded = PARAMS.__class__(**{**PARAMS.__dict__, "ratio_threshold": 1.0005})
    rows, launch = assert_two_processes_match_one(tmp_path, guarded, config=ZERO[stage])
    assert [row["skipped"] for row in rows] == [False, True, True, True]
    # shipped zero3.yaml: the tiny model's parameters are below DeepSpeed's persistence threshold
    # (gathered once, then kept whole)
    assert_partitioned(launch.stderr, stage, policy="whole", reference=None)


def test_zero3_matches_one_process_with_a_lora_policy(tmp_path):
    """Adapters and value head train partitioned; the reference is the partitioned policy with adapters off."""
    lora = {"lora_r": 4, "lora_alpha": 8.0, "lora_target_modules": ["c_attn"]}
    rows, launch = assert_two_processes_match_one(tmp_path, PARAMS, lora, config=zero3_unpersisted(tmp_path))
    assert not any(row["skipped"] for row in rows)
    assert_partitioned(launch.stderr, 3, policy="partitioned", reference="the policy with adapters off")
    assert_one_process_layout(tmp_path)


def test_zero3_matches_one_process_with_shared_lower_layers(tmp_path):
    """ppo.num_shared_layers: the frozen shared embeddings, partitioned by the policy's engine, serve the
    reference's engine too."""
    shared = PARAMS.__class__(**{**PARAMS.__dict__, "num_shared_layers": 0})
    rows, launch = assert_two_processes_match_one(tmp_path, shared, config=zero3_unpersisted(tmp_path))
    assert not any(row["skipped"] for row in rows)
    assert_partitioned(launch.stderr, 3, policy="partitioned", reference="partitioned")


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_clips_at_ppo_max_grad_norm_as_one_process(tmp_path, stage):
    """The engine clips in its step at ppo.max_grad_norm (not the launch file's gradient_clipping: 1.0)
    with the global norm, and reports the norm before clipping, as torch.nn.utils.clip_grad_norm_."""
    clipped = PARAMS.__class__(**{**PARAMS.__dict__, "max_grad_norm": 0.5})
    rows, _ = assert_two_processes_match_one(tmp_path, clipped, config=ZERO[stage])
    assert all(row["grad_norm"] > clipped.max_grad_norm for row in rows)  # every step was clipped
