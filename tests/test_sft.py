"""Supervised fine-tuning in the base stage (TRL SFTTrainer) on a TL;DR corpus built from a saved dataset."""
import dataclasses
import random

import pytest
import torch
from conftest import save_tiny_gpt2, train_bpe
from datasets import Dataset, DatasetDict
from transformers import AutoModelForCausalLM

from pipeline.core.config import BaseParams, WorldParams
from pipeline.model.policy import load_policy
from pipeline.model.sft import context_length, corpus_loss, supervised_finetune
from pipeline.steps.base import build_base_model
from pipeline.steps.prepare import prepare

PETS, ACTS = ["dog", "cat", "parrot", "hamster"], ["ate my homework", "hid under the bed", "woke me at 5am",
                                                   "learned to open doors"]


def tldr_rows(n: int, seed: int) -> list[dict]:
    draw = random.Random(seed)
    rows = []
    for _ in range(n):
        pet, act = draw.choice(PETS), draw.choice(ACTS)
        rows.append({"prompt": f"SUBREDDIT: r/pets\nTITLE: my {pet}\nPOST: So yesterday my {pet} {act} again and "
                               f"I do not know what to do about it.\nTL;DR: ",
                     "label": f"my {pet} {act}"})
    return rows


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tldr")
    DatasetDict({"train": Dataset.from_list(tldr_rows(80, 0)), "test": Dataset.from_list(tldr_rows(10, 1))}
                ).save_to_disk(folder)
    world = dataclasses.replace(WorldParams(), source=str(folder), n_train_prompts=60, n_eval_prompts=8)
    lines, _ = prepare(task="summarization", run_id="t", seed=0, world=world)
    return lines


@pytest.fixture(scope="module")
def model_dir(corpus, tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("gpt2")
    tokenizer = train_bpe(corpus, vocab_size=400)
    tokenizer.pad_token = tokenizer.eos_token  # the paper's GPT-2 setting
    return save_tiny_gpt2(out, tokenizer, n_positions=96)


def test_corpus_lines_are_document_tldr_reference(corpus):
    assert len(corpus) == 80
    assert all(" TL;DR: my " in line and "\n" not in line for line in corpus)


def test_sft_lowers_the_corpus_loss_and_saves_a_loadable_base(corpus, model_dir, tmp_path):
    base = BaseParams(model=model_dir, sft_steps=40, batch_size=8, learning_rate=3e-3)
    stats = build_base_model(corpus, out_dir=tmp_path / "base", seed=0, base=base, progress=False)
    print({k: v for k, v in stats.items()})
    assert stats["source"] == model_dir and stats["sft_steps"] == 40
    assert stats["sft_loss_after"] < stats["sft_loss_before"] - 1.0
    policy, tokenizer = load_policy(tmp_path / "base")  # what the first PPO round loads
    assert tokenizer.pad_token == tokenizer.eos_token
    # independent measurement on every corpus line: the saved weights, not the in-memory ones
    before = AutoModelForCausalLM.from_pretrained(model_dir)
    after = policy.lm
    assert corpus_loss(after, tokenizer, corpus, max_length=96) < corpus_loss(before, tokenizer, corpus, max_length=96)
    assert not list(tmp_path.glob("base/checkpoint-*"))


def test_sft_is_seeded(corpus, model_dir):
    def finetuned(seed):
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        tokenizer = load_policy(model_dir)[1]
        stats = supervised_finetune(model, tokenizer, corpus, steps=3, batch_size=4, learning_rate=1e-3, seed=seed,
                                    progress=False)
        return stats, model.state_dict()

    (s1, w1), (s2, w2), (_, w3) = finetuned(0), finetuned(0), finetuned(1)
    assert s1["sft_loss_after"] == s2["sft_loss_after"]
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    assert not all(torch.equal(w1[k], w3[k]) for k in w1)


def test_corpus_loss_is_the_mean_token_nll(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = load_policy(model_dir)[1]
    texts = ["my dog ate my homework", "cat"]
    total, count = 0.0, 0
    for text in texts:  # one unpadded sequence at a time, summed by hand
        ids = tokenizer(text + tokenizer.eos_token, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            log_p = torch.log_softmax(model(input_ids=ids).logits[0, :-1], dim=-1)
        total -= sum(log_p[t, ids[0, t + 1]].item() for t in range(ids.shape[1] - 1))
        count += ids.shape[1] - 1
    assert corpus_loss(model, tokenizer, texts, max_length=96, batch_size=2) == pytest.approx(total / count, rel=1e-5)
    assert context_length(model) == 96


def test_sft_also_runs_after_the_demo_pretraining(corpus, tmp_path):
    base = BaseParams(vocab_size=300, n_layer=1, n_head=2, n_embd=32, block_size=32, steps=10, batch_size=8,
                      sft_steps=5)
    stats = build_base_model(corpus, out_dir=tmp_path, seed=0, base=base, progress=False)
    assert stats["source"] == "pretrained" and stats["steps"] == 10 and stats["sft_steps"] == 5
    assert stats["sft_loss_after"] < stats["sft_loss_before"]
    assert load_policy(tmp_path)[0].lm.config.n_positions == 32
