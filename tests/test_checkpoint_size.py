"""Checkpoint contents and bytes: what the ppo stage writes, against `drlc estimate`'s disk model.

- The bytes of a real checkpoint (pipeline.steps.ppo_round) match pipeline.commands.estimate.estimate_disk,
  counted from the tiny base's config.json: full policy with shared lower layers, and LoRA.
- A LoRA checkpoint holds the adapters, their optimizer state, value head and tokenizer only:
  no base weight file; adapter_config.json references the base folder.
- Weights stay fp32 under `mixed_precision: bf16` (autocast over fp32 master weights), so a
  resumed bf16 round equals the uninterrupted one bit for bit; saving bf16 weights would not
  (the negative control rounds them and round 2 changes).
"""
from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_resume import PARAMS, SEED, as_batch, round_tables, save_tiny_base

from pipeline.commands.estimate import estimate_disk
from pipeline.core.config import BaseParams, load_params
from pipeline.core.seeding import round_seed
from pipeline.model.policy import load_policy, load_reference
from pipeline.steps.ppo_round import new_kl_controller, ppo_round
from pipeline.train.ppo import RunningMoments
from pipeline.train.trainer import make_optimizer, train_round

torch.set_num_threads(1)
BF16 = dataclasses.replace(PARAMS, mixed_precision="bf16")
LORA = BaseParams(lora_r=4, lora_alpha=8.0, lora_target_modules=["c_attn"])


def close(actual: int, expected: int, tensors: int) -> bool:
    """Equal up to file framing: safetensors' JSON header, torch.save's zip records and Adam's step scalars."""
    return abs(actual - expected) < 4096 + 1024 * tensors


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("size") / "base"
    save_tiny_base(path, n_layer=3)
    return path


def train(base_dir, policy_dir, out_dir, round_: int, tables, params=PARAMS, base=None):
    return ppo_round(*tables, policy_dir=str(policy_dir), reference_dir=str(base_dir), out_dir=str(out_dir),
                     params=params, run_id="t", round_=round_, seed=SEED, base=base)


def estimate_for(base_dir, *, lora: bool, num_shared_layers=None):
    """estimate_disk of the demo params pointed at the tiny base folder."""
    params = load_params("params.yaml")
    base = dataclasses.replace(params.base, model=str(base_dir), lora_r=LORA.lora_r if lora else 0,
                               lora_target_modules=LORA.lora_target_modules)
    params = dataclasses.replace(params, base=base, ppo=dataclasses.replace(params.ppo,
                                                                          num_shared_layers=num_shared_layers))
    return estimate_disk(params, root="/", cache_type="hardlink")


def size(path) -> int:
    return path.stat().st_size


def test_full_checkpoint_bytes_match_the_estimate(base_dir, tmp_path):
    policy, _ = load_policy(base_dir, seed=SEED)
    params = dataclasses.replace(PARAMS, num_shared_layers=1)
    train(base_dir, base_dir, tmp_path / "round=0001", 1, round_tables(policy, 1), params=params)
    out, est = tmp_path / "round=0001", estimate_for(base_dir, lora=False, num_shared_layers=1)
    tensors = len(load_file(str(out / "model.safetensors")))
    assert close(size(out / "model.safetensors"), est.weights_bytes, tensors)
    assert close(size(out / "optimizer.pt"), est.optimizer_bytes, 3 * tensors)
    assert close(size(out / "value_head.safetensors"), est.value_head_bytes, 2)
    # shared lower layers have no Adam moments: the optimizer is well under 2x the weights
    assert est.optimizer_bytes < 2 * est.weights_bytes
    trainable = sum(p.numel() for p in load_optimizer_params(out))
    assert est.optimizer_bytes == 2 * 4 * trainable


def load_optimizer_params(folder):
    state = torch.load(folder / "optimizer.pt", weights_only=True)["state"]
    return [s["exp_avg"] for s in state.values()]


def test_lora_checkpoint_holds_adapters_only_and_matches_the_estimate(base_dir, tmp_path):
    policy, _ = load_policy(base_dir, seed=SEED)
    train(base_dir, base_dir, tmp_path / "round=0001", 1, round_tables(policy, 1), base=LORA)
    out, est = tmp_path / "round=0001", estimate_for(base_dir, lora=True)
    names = {p.name for p in out.iterdir()}
    assert "model.safetensors" not in names and not any(n.startswith("pytorch_model") for n in names)
    adapter_file = out / "adapter_model.safetensors"
    adapters = load_file(str(adapter_file))
    assert all("lora_" in key for key in adapters), sorted(adapters)  # no base tensor was copied
    assert sum(t.numel() for t in adapters.values()) == est.policy.adapter_params
    assert close(size(adapter_file), est.weights_bytes, len(adapters))
    assert close(size(out / "optimizer.pt"), est.optimizer_bytes, 3 * (len(adapters) + 2))
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == str(base_dir)
    assert est.checkpoint_bytes < est.base_bytes  # a LoRA checkpoint is smaller than the base it references


def uninterrupted(base_dir, params) -> dict:
    """Rounds 1 and 2 with the same in-memory objects (as tests/test_resume.py), under `params`."""
    policy, _ = load_policy(base_dir, seed=SEED)
    reference = load_reference(base_dir)
    optimizer, controller, moments = make_optimizer(policy, params.learning_rate), new_kl_controller(params), RunningMoments()
    rounds = {}
    for round_ in (1, 2):
        torch.manual_seed(round_seed(SEED, round_, 3))
        tables = round_tables(policy, round_)
        train_round(policy=policy, ref_model=reference, optimizer=optimizer, batch=as_batch(*tables), params=params,
                    kl_controller=controller, score_moments=moments, seed=round_seed(SEED, round_, 4), progress=False)
        rounds[round_] = {"tables": tables, "weights": {k: v.clone() for k, v in policy.state_dict().items()}}
    return rounds


def saved_weights(folder) -> dict:
    return load_policy(folder, seed=12345)[0].state_dict()


def test_bf16_round_resumes_bit_for_bit_from_fp32_weights(base_dir, tmp_path):
    expected = uninterrupted(base_dir, BF16)
    train(base_dir, base_dir, tmp_path / "round=0001", 1, expected[1]["tables"], params=BF16)
    assert load_file(str(tmp_path / "round=0001" / "model.safetensors"))["transformer.h.2.attn.c_attn.weight"].dtype \
        == torch.float32
    train(base_dir, tmp_path / "round=0001", tmp_path / "round=0002", 2, expected[2]["tables"], params=BF16)
    weights = saved_weights(tmp_path / "round=0002")
    assert all(torch.equal(weights[k], expected[2]["weights"][k]) for k in weights)

    # negative control: the same checkpoint with its weights stored in bf16 gives a different round 2
    rounded = tmp_path / "bf16" / "round=0001"
    shutil.copytree(tmp_path / "round=0001", rounded)
    state = load_file(str(rounded / "model.safetensors"))
    save_file({k: v.to(torch.bfloat16).float() for k, v in state.items()}, str(rounded / "model.safetensors"))
    train(base_dir, rounded, tmp_path / "bf16" / "round=0002", 2, expected[2]["tables"], params=BF16)
    other = saved_weights(tmp_path / "bf16" / "round=0002")
    assert not all(torch.equal(other[k], expected[2]["weights"][k]) for k in other)
