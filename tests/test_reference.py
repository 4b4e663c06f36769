"""The reference model's three forms (pipeline/model/reference.py) through the ppo stage's own code.

- shared lower layers (ppo.num_shared_layers): which parameters are shared, that they are frozen
  and stored once, that training leaves them and the reference untouched;
- LoRA (base.lora_r): only adapters and value head train, the reference = adapters disabled
  computes exactly the base model, save/load round trip, a tiny Llama with q/v projections;
- bad input: sharing every block, changing num_shared_layers mid-run, LoRA + shared layers,
  LoRA target modules the model does not have.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from pipeline.core.config import BaseParams, PPOParams
from pipeline.core.errors import ConfigError
from pipeline.model.logprobs import response_logprobs
from pipeline.model.lora import add_adapters, has_adapters, is_adapter_folder
from pipeline.model.policy import load_policy, load_reference
from pipeline.model.reference import AdaptersDisabled, make_reference, shared_parameter_names
from pipeline.steps.ppo_round import ppo_round
from tests.test_resume import PAD, round_tables, save_tiny_base

torch.set_num_threads(1)
PARAMS = PPOParams(learning_rate=1e-2, mini_batch_size=8, ppo_epochs=2, init_kl_coef=0.05)
LORA = BaseParams(lora_r=4, lora_alpha=8.0)


def run_round(tmp_path, policy_dir, reference_dir, name, round_=1, params=PARAMS, base=None):
    policy, _ = load_policy(policy_dir)
    rollouts, scores, annotations = round_tables(policy, round_)
    out = tmp_path / name
    ppo_round(rollouts, scores, annotations, policy_dir=str(policy_dir), reference_dir=str(reference_dir),
              out_dir=str(out), params=params, run_id="t", round_=round_, seed=3, base=base)
    return out


def logprobs(model, rollouts) -> torch.Tensor:
    with torch.no_grad():
        return response_logprobs(model, query_ids=[r["query_ids"] for r in rollouts],
                                  response_ids=[r["response_ids"] for r in rollouts], pad_id=PAD).logprobs


@pytest.fixture(scope="module")
def base3(tmp_path_factory):
    path = tmp_path_factory.mktemp("reference") / "base"
    save_tiny_base(path, n_layer=3)
    return path


def test_shared_names_are_embeddings_and_lower_blocks(base3):
    lm = AutoModelForCausalLM.from_pretrained(base3)
    names = [n for n, _ in lm.named_parameters()]
    expected = [n for n in names if n.startswith(("transformer.wte.", "transformer.wpe.",
                                                  "transformer.h.0.", "transformer.h.1."))]
    assert shared_parameter_names(lm, 2) == expected
    assert shared_parameter_names(lm, 0) == ["transformer.wte.weight", "transformer.wpe.weight"]
    with pytest.raises(ConfigError, match="num_shared_layers' = 3 .*has 3 blocks"):
        shared_parameter_names(lm, 3)


def test_shared_layers_are_frozen_stored_once_and_untouched_by_training(tmp_path, base3):
    policy, _ = load_policy(base3)
    reference = make_reference(policy, base3, num_shared_layers=2)
    for name, param in policy.lm.named_parameters():
        assert param.requires_grad == (name not in shared_parameter_names(policy.lm, 2)), name
    ref_params = dict(reference.lm.named_parameters(remove_duplicate=False))
    assert ref_params["transformer.h.1.attn.c_attn.weight"] is policy.lm.transformer.h[1].attn.c_attn.weight
    assert ref_params["lm_head.weight"] is policy.lm.transformer.wte.weight  # tied output layer: shared too
    assert ref_params["transformer.h.2.attn.c_attn.weight"] is not policy.lm.transformer.h[2].attn.c_attn.weight

    shared = dataclasses.replace(PARAMS, num_shared_layers=2)
    round1 = run_round(tmp_path, base3, base3, "round1", params=shared)
    before, after = AutoModelForCausalLM.from_pretrained(base3), AutoModelForCausalLM.from_pretrained(round1)
    old, new = dict(before.named_parameters()), dict(after.named_parameters())
    for name in old:
        frozen = name in shared_parameter_names(before, 2)
        assert torch.equal(old[name], new[name]) == frozen, name
    # round 2 from round 1 passes the "lower layers still equal the base" check
    round2 = run_round(tmp_path, round1, base3, "round2", round_=2, params=shared)
    assert torch.equal(AutoModelForCausalLM.from_pretrained(round2).transformer.h[0].mlp.c_fc.weight,
                       before.transformer.h[0].mlp.c_fc.weight)


def test_reference_with_shared_layers_scores_like_the_base(tmp_path, base3):
    shared = dataclasses.replace(PARAMS, num_shared_layers=1)
    round1 = run_round(tmp_path, base3, base3, "round1", params=shared)
    policy, _ = load_policy(round1)
    reference = make_reference(policy, base3, num_shared_layers=1)
    rollouts, _, _ = round_tables(policy, 2)
    assert torch.equal(logprobs(reference, rollouts), logprobs(load_reference(base3), rollouts))
    assert not torch.allclose(logprobs(policy, rollouts), logprobs(reference, rollouts))


def test_changing_num_shared_layers_mid_run_is_refused(tmp_path, base3):
    round1 = run_round(tmp_path, base3, base3, "round1")  # every weight trained
    with pytest.raises(ConfigError, match="differs from the reference's"):
        run_round(tmp_path, round1, base3, "round2", round_=2, params=dataclasses.replace(PARAMS, num_shared_layers=1))


def test_lora_round_trains_adapters_only_and_reference_is_the_base(tmp_path, base3):
    round1 = run_round(tmp_path, base3, base3, "round1", base=LORA)
    assert is_adapter_folder(round1) and not (round1 / "model.safetensors").exists()
    policy, _ = load_policy(round1)
    assert has_adapters(policy.lm)
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or n.startswith("v_head.") for n in trainable)
    base_lm = AutoModelForCausalLM.from_pretrained(base3)
    merged_off = dict(policy.lm.get_base_model().named_parameters())
    for name, param in base_lm.named_parameters():  # the base weights inside the LoRA model are untouched
        assert torch.equal(param, merged_off[name.replace("c_attn.weight", "c_attn.base_layer.weight")
                                             .replace("c_attn.bias", "c_attn.base_layer.bias")]), name
    reference = make_reference(policy, base3)
    assert isinstance(reference, AdaptersDisabled)
    rollouts, _, _ = round_tables(policy, 2)
    assert torch.allclose(logprobs(reference, rollouts), logprobs(load_reference(base3), rollouts), atol=1e-6)
    assert not torch.allclose(logprobs(policy, rollouts), logprobs(reference, rollouts), atol=1e-3)
    # round 2 starts from the saved adapters: the reloaded policy scores exactly as before saving
    round2 = run_round(tmp_path, round1, base3, "round2", round_=2, base=LORA)
    assert is_adapter_folder(round2)


def test_a_grpo_lora_round_trains_adapters_only_with_no_value_head(tmp_path, base3):
    """LoRA under a value-free algorithm: adapters alone train (no value head built or saved), the reference is
    the base (adapters off), and round 2 starts from the saved adapters."""
    from test_value_free_resume import grouped

    grpo = dataclasses.replace(PARAMS, algorithm="grpo", vf_coef=0.0)
    previous = base3
    for round_ in (1, 2):
        policy, _ = load_policy(previous, value_head=False)
        out = tmp_path / f"round{round_}"
        rows = ppo_round(*grouped(round_tables(policy, round_)), policy_dir=str(previous), reference_dir=str(base3),
                         out_dir=str(out), params=grpo, run_id="t", round_=round_, seed=3, base=LORA)
        assert rows and all(r["value_loss"] == 0 and r["grad_norm"] > 0 for r in rows)
        assert is_adapter_folder(out) and not (out / "model.safetensors").exists()
        assert not (out / "value_head.safetensors").exists()
        previous = out
    policy, _ = load_policy(previous, value_head=False)
    assert policy.v_head is None and has_adapters(policy.lm)
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    reference = make_reference(policy, base3)
    assert isinstance(reference, AdaptersDisabled)
    rollouts, _, _ = round_tables(policy, 3)
    assert torch.allclose(logprobs(reference, rollouts), logprobs(load_reference(base3), rollouts), atol=1e-6)
    assert not torch.allclose(logprobs(policy, rollouts), logprobs(reference, rollouts), atol=1e-3)


def test_lora_save_load_round_trip_is_exact(tmp_path, base3):
    round1 = run_round(tmp_path, base3, base3, "round1", base=LORA)
    policy, _ = load_policy(round1)
    rollouts, _, _ = round_tables(policy, 2)
    again, _ = load_policy(round1)
    assert torch.equal(logprobs(policy, rollouts), logprobs(again, rollouts))


def tiny_llama(path) -> None:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=PAD, bos_token_id=1, eos_token_id=1)
    LlamaForCausalLM(config).save_pretrained(path)
    save_tiny_base(path / "tok")  # only its tokenizer is used
    for file in (path / "tok").glob("tokenizer*"):
        file.rename(path / file.name)
    (path / "tok" / "special_tokens_map.json").unlink(missing_ok=True)


def test_lora_on_a_tiny_llama_with_q_and_v_projections(tmp_path):
    base = tmp_path / "llama"
    tiny_llama(base)
    lora = dataclasses.replace(LORA, lora_target_modules=["q_proj", "v_proj"])
    round1 = run_round(tmp_path, base, base, "round1", base=lora)
    policy, _ = load_policy(round1)
    adapted = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n, _ in policy.named_parameters() if "lora_" in n}
    assert adapted == {"q_proj", "v_proj"}


def test_lora_bad_input(tmp_path, base3):
    policy, _ = load_policy(base3)
    with pytest.raises(ConfigError, match=r"\['q_proj'\] matches no module of the gpt2 model: .*c_attn"):
        add_adapters(policy.lm, r=4, alpha=8.0, target_modules=["q_proj"], seed=0, base_dir=base3)
    policy.lm = add_adapters(policy.lm, r=4, alpha=8.0, target_modules=[], seed=0, base_dir=base3)
    with pytest.raises(ConfigError, match="exclude each other"):
        make_reference(policy, base3, num_shared_layers=1)
