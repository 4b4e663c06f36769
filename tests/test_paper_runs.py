"""Paper configs run one round offline with their models replaced by tiny stand-ins (real DVC).

Each test takes a configs/paper/*.yaml file, keeps its method settings (LoRA, shared layers,
self-critique, SFT, reward model, score scaling, length ranges, token prefixes, pad = eos) and
replaces only what needs the network or a GPU: hub models -> tiny models built from config and
saved in hub layout, hub datasets -> tiny save_to_disk datasets in the same schema, the OpenAI /
Perspective endpoints -> drlc's local critic server / an offline scorer, and the sizes.
Then it checks that the paper's code path really ran, from the run's own outputs.
"""
from __future__ import annotations

import json
import random

import pytest
import torch
import yaml
from conftest import save_tiny_gpt2, train_bpe
from datasets import Dataset, DatasetDict
from e2e import ROOT, dvc, make_project
from transformers import AutoModelForCausalLM, GPT2Config, GPT2ForSequenceClassification, LlamaConfig, LlamaForCausalLM

from pipeline.core import store
from pipeline.model.reference import shared_parameter_names
from pipeline.rewards.reward_model import TrunkWithHead

pytestmark = [pytest.mark.slow, pytest.mark.long]  # each paper profile, shrunk, end to end
GOOD = "great wonderful lovely superb fine charming".split()
BAD = "awful boring terrible dull poor bad".split()
FILLER = "the film was a quiet story and every scene of the cast felt".split()
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


GRPO_PPO = {"ppo": {}, "grpo": {"algorithm": "grpo", "vf_coef": 0.0}}  # a paper profile's ppo section, made value-free


def sentence(draw: random.Random, n: int) -> str:
    return " ".join(draw.choice(FILLER + GOOD + BAD) for _ in range(n))


def tokenizer_for(texts: list[str]):
    """A GPT-2 style BPE without a pad token, like gpt2-large's and Llama-2's (base.pad_token: eos)."""
    tokenizer = train_bpe(texts, vocab_size=400)
    assert tokenizer.pad_token_id is None
    return tokenizer


def save_gpt2(folder, texts: list[str], n_layer: int = 3) -> None:
    save_tiny_gpt2(folder, tokenizer_for(texts), n_layer=n_layer, n_positions=256)


def paper_params(name: str, project_data: dict, **sections) -> dict:
    """configs/paper/<name>.yaml with tiny sizes, one round and the given section updates."""
    raw = yaml.safe_load((ROOT / "configs" / "paper" / f"{name}.yaml").read_text())
    raw["run"]["run_id"] = "paper-e2e"
    raw["world"].update(n_reviews=200, n_train_prompts=16, n_eval_prompts=2, **project_data)
    raw["base"].update(batch_size=4)
    raw["rollout"].update(batch_size=8, generation_batch_size=8)
    raw["ppo"].update(mini_batch_size=8 // raw["ppo"]["gradient_accumulation_steps"])
    raw["evaluate"].update(policy="round=0001", prompts=["world"], n_prompts=2, samples_per_prompt=2,
                           max_new_tokens=6, batch_size=8)
    raw["rounds"], raw["chunks"] = {"0001": {"prev": "base"}}, {}  # one per-round stage set (the configs chunk)
    raw["run"]["rounds_per_stage"] = 1
    for section, values in sections.items():
        raw[section].update(values)
    return raw


def run_project(tmp_path, params: dict):
    project = make_project(tmp_path, params)
    dvc(["repro"], project)
    return project


def test_sentiment_dense_shared_layers_token_prefixes_and_length_range(tmp_path):
    draw = random.Random(0)
    reviews = [sentence(draw, 50) for _ in range(60)]
    imdb = tmp_path / "imdb"
    DatasetDict({"train": Dataset.from_dict({"text": reviews + ["too short"] * 5, "label": [0, 1] * 32 + [0]})}
                ).save_to_disk(imdb)
    model, classifier = tmp_path / "gpt2-large", tmp_path / "distilbert-imdb"
    save_gpt2(model, reviews)
    tokenizer = tokenizer_for(reviews)
    tokenizer.pad_token = tokenizer.eos_token
    torch.manual_seed(1)
    GPT2ForSequenceClassification(GPT2Config(
        vocab_size=len(tokenizer), n_positions=256, n_embd=32, n_layer=1, n_head=2, num_labels=2,
        id2label={0: "NEGATIVE", 1: "POSITIVE"}, label2id={"NEGATIVE": 0, "POSITIVE": 1},
        pad_token_id=tokenizer.pad_token_id)).save_pretrained(classifier)
    tokenizer.save_pretrained(classifier)
    params = paper_params("sentiment-dense", {"source": f"{imdb}:train"},
                          base={"model": str(model)}, score={"model": str(classifier)},
                          critic={"endpoint": "local", "backend": "lexicon", "model": "drlc-lexicon"},
                          ppo={"num_shared_layers": 2, "learning_rate": 1e-3},
                          evaluate={"classifier_data": "world", "prompts": ["world"]})
    assert params["world"]["prefix_unit"] == "tokens" and params["rollout"]["min_new_tokens"] == 15
    project = run_project(tmp_path, params)

    prompts = store.read_table(project / "data/prompts/round=0000", "prompts")
    assert all(4 <= len(tokenizer(p["text"], add_special_tokens=False)["input_ids"]) <= 10 for p in prompts)
    rollouts = store.read_table(project / "data/rollouts/round=0001", "rollouts")
    assert all(len(r["response_ids"]) <= r["max_new_tokens"] and 15 <= r["max_new_tokens"] <= 20 for r in rollouts)
    critique = json.loads((project / "metrics/critique/round=0001.json").read_text())
    assert critique["critiqued"] == 8 and critique["critic_requests"] == 8  # threshold 10: all
    base = AutoModelForCausalLM.from_pretrained(project / "models/base")
    trained = dict(AutoModelForCausalLM.from_pretrained(project / "models/round=0001").named_parameters())
    for name, param in base.named_parameters():
        assert torch.equal(param, trained[name]) == (name in shared_parameter_names(base, 2)), name


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_self_critique_lora_policy_critiqued_by_its_own_base_through_the_hf_backend(tmp_path, algorithm):
    draw = random.Random(1)
    rows = [{"prompt": {"text": sentence(draw, 6), "toxicity": 0.7 + 0.01 * (i % 20)},
             "continuation": {"text": sentence(draw, 8), "toxicity": 0.1}} for i in range(40)]
    rtp = tmp_path / "rtp"
    Dataset.from_list(rows).save_to_disk(rtp)
    texts = [r["prompt"]["text"] + " " + r["continuation"]["text"] for r in rows]
    llama = tmp_path / "Llama-2-7b-chat-hf"
    tokenizer = tokenizer_for(texts + ["user: assistant: system: Toxic:"])
    tokenizer.chat_template = CHAT_TEMPLATE
    torch.manual_seed(0)
    eos = tokenizer.eos_token_id
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1024,
                                 bos_token_id=eos, eos_token_id=eos)).save_pretrained(llama)
    tokenizer.save_pretrained(llama)
    params = paper_params("self-critique", {"source": str(rtp)}, base={"model": str(llama)},
                          score={"scorer": "lexicon"},
                          # a random tiny Llama never stops within 8 tokens, so every answer is truncated;
                          # this test checks the self-critique plumbing (the error gate has its own tests)
                          critic={"max_tokens": 8, "threshold": 1.0, "max_error_rate": 1.0},
                          ppo={"learning_rate": 1e-3, **GRPO_PPO[algorithm]},
                          rollout={"samples_per_prompt": 2 if algorithm == "grpo" else 1})
    assert params["base"]["lora_r"] == 16 and params["critic"]["backend"] == "hf"
    assert params["critic"]["model_dir"] == "base" and params["ppo"]["mixed_precision"] == "bf16"
    project = run_project(tmp_path, params)

    critique = json.loads((project / "metrics/critique/round=0001.json").read_text())
    assert critique["critiqued"] == 8 and critique["critic_requests"] == 8
    round1 = project / "models/round=0001"
    assert (round1 / "adapter_config.json").is_file() and not (round1 / "model.safetensors").exists()
    adapter = json.loads((round1 / "adapter_config.json").read_text())
    assert adapter["r"] == 16 and adapter["lora_alpha"] == 32 and adapter["base_model_name_or_path"] == "models/base"
    steps = store.read_table(project / "data/ppo_steps/round=0001", "ppo_steps")
    assert len(steps) == 4  # 8 rollouts / (minibatch 4 x grad-accum 2) x 4 epochs
    assert (project / "metrics/eval.json").is_file()
    if algorithm == "grpo":  # 4 prompts x 2 responses, no value head; the critic read every response
        rollouts = store.read_table(project / "data/rollouts/round=0001", "rollouts")
        assert [r["sample_index"] for r in rollouts] == [0, 1] * 4 and len({r["prompt_id"] for r in rollouts}) == 4
        assert not (round1 / "value_head.safetensors").exists()
        # (no grad_norm check: the lexicon scores these random responses alike, so tied groups can give 0)
        assert all(s["value_loss"] == 0 and s["vf_clipfrac"] == 0 for s in steps)


def test_summarization_rm_dense_sft_reward_model_normalised_and_score_scaling(tmp_path):
    draw = random.Random(2)
    posts = [{"prompt": f"SUBREDDIT: r/movies\nTITLE: {sentence(draw, 4)}\nPOST: {sentence(draw, 30)}\nTL;DR: ",
              "label": sentence(draw, 6)} for _ in range(40)]
    tldr = tmp_path / "tldr"
    DatasetDict({"train": Dataset.from_list(posts)}).save_to_disk(tldr)
    texts = [p["prompt"] + p["label"] for p in posts]
    gpt2, rm = tmp_path / "gpt2-medium", tmp_path / "rm_checkpoint"
    save_gpt2(gpt2, texts, n_layer=2)
    tokenizer = tokenizer_for(texts)
    tokenizer.pad_token = tokenizer.eos_token
    trunk_config = GPT2Config(vocab_size=len(tokenizer), n_positions=512, n_embd=32, n_layer=1, n_head=2)
    torch.manual_seed(2)
    rm.mkdir()
    torch.save(TrunkWithHead(trunk_config).state_dict(), rm / "pytorch_model.bin")
    trunk_config.save_pretrained(rm)
    tokenizer.save_pretrained(rm)
    params = paper_params("summarization-rm-dense", {"source": f"{tldr}:train"},
                          base={"model": str(gpt2), "sft_steps": 3, "block_size": 256},
                          score={"model": str(rm)}, evaluate={"reward_model": str(rm)},
                          critic={"endpoint": "local", "backend": "lexicon", "model": "drlc-lexicon"},
                          rollout={"min_new_tokens": 3, "max_new_tokens": 5},
                          ppo={"num_shared_layers": 1, "learning_rate": 1e-3})
    assert params["base"]["sft_steps"] > 0 and params["score"]["normalize"] and params["ppo"]["use_score_scaling"]
    project = run_project(tmp_path, params)

    untuned = dict(AutoModelForCausalLM.from_pretrained(gpt2).named_parameters())
    tuned = AutoModelForCausalLM.from_pretrained(project / "models/base")
    assert any(not torch.equal(p, untuned[n]) for n, p in tuned.named_parameters())  # SFT changed the base
    scores = store.read_table(project / "data/scores/round=0001", "scores")
    rewards = torch.tensor([s["env_reward_shaped"] for s in scores], dtype=torch.float64)  # score.normalize
    assert abs(rewards.mean().item()) < 1e-6 and abs(rewards.std(unbiased=False).item() - 1) < 1e-6
    raw = torch.tensor([s["env_reward"] for s in scores], dtype=torch.float64)  # the RM's own scores, kept
    assert torch.allclose((raw - raw.mean()) / raw.std(unbiased=False), rewards)
    metrics = json.loads((project / "metrics/eval.json").read_text())
    world = metrics["round=0001"]["world"]
    assert {"rm_score", "win_rate", "rouge1"} <= set(world) and 0 <= world["win_rate"] <= 1
