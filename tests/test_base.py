"""The base stage: tokenizer training, deterministic tiny GPT-2 pretraining, sampling."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, GPT2LMHeadModel

from pipeline import base
from pipeline.data import world
from pipeline.errors import ConfigError, DataError

TINY = dict(n_layer=1, n_head=2, n_embd=64, block_size=32, steps=60, batch_size=8, learning_rate=3e-3)


@pytest.fixture(scope="module")
def texts():
    return world.generate_reviews(2000, seed=0)


@pytest.fixture(scope="module")
def tokenizer(texts, tmp_path_factory):
    return base.train_tokenizer(texts, vocab_size=400, out_dir=tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def model_dir(texts, tokenizer, tmp_path_factory):
    out = tmp_path_factory.mktemp("model")
    base.pretrain(texts, tokenizer, seed=0, out_dir=out, progress=False, **TINY)
    return out


def test_tokenizer_special_tokens(tokenizer):
    assert len(tokenizer) == 400
    assert tokenizer.eos_token == tokenizer.bos_token == "<|endoftext|>"
    assert tokenizer.pad_token == "<|pad|>"
    assert tokenizer.pad_token_id != tokenizer.eos_token_id


def test_tokenizer_training_is_deterministic(texts, tokenizer, tmp_path):
    base.train_tokenizer(texts, vocab_size=400, out_dir=tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again.get_vocab() == tokenizer.get_vocab()
    assert again.backend_tokenizer.to_str() == tokenizer.backend_tokenizer.to_str()


@pytest.mark.parametrize("text", [
    "The plot was good. I loved it!", "  two  spaces, café ☺ and\nnewline", "Overall, the ending",
])
def test_tokenizer_round_trips_text(tokenizer, text):
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text


def test_offsets_point_at_each_tokens_characters(tokenizer, tmp_path):
    text = "The acting in this film was really dull, but I loved the soundtrack."
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    pieces = [text[start:end] for start, end in encoded["offset_mapping"]]
    tokens = [tokenizer.decode([i]) for i in encoded["input_ids"]]
    assert pieces == [t.lstrip(" ") for t in tokens]  # leading space trimmed, nothing else
    assert "".join(tokens) == text
    base.train_tokenizer(world.generate_reviews(2000, seed=0), vocab_size=400, out_dir=tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"] == \
        encoded["offset_mapping"]


def test_pretraining_is_bit_identical_for_a_seed(texts, tokenizer, model_dir, tmp_path):
    threads = torch.get_num_threads()
    stats = base.pretrain(texts, tokenizer, seed=0, out_dir=tmp_path / "again", progress=False, **TINY)
    first = load_file(Path(model_dir) / "model.safetensors")
    second = load_file(tmp_path / "again" / "model.safetensors")
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert (Path(model_dir) / "model.safetensors").read_bytes() == (tmp_path / "again" / "model.safetensors").read_bytes()
    assert torch.get_num_threads() == threads and not torch.are_deterministic_algorithms_enabled()
    assert set(stats) == {"final_loss", "steps", "seconds", "tokens_seen"}
    assert stats["tokens_seen"] == TINY["steps"] * TINY["batch_size"] * TINY["block_size"]
    base.pretrain(texts, tokenizer, seed=1, out_dir=tmp_path / "other", progress=False, **TINY)
    other = load_file(tmp_path / "other" / "model.safetensors")
    assert not all(torch.equal(first[k], other[k]) for k in first)


def test_pretraining_learns_and_saves_a_loadable_model(texts, tokenizer, model_dir, tmp_path):
    stats = base.pretrain(texts, tokenizer, seed=0, out_dir=tmp_path, progress=False, **TINY)
    assert stats["final_loss"] < 0.7 * torch.log(torch.tensor(400.0)).item()  # far below uniform
    model = GPT2LMHeadModel.from_pretrained(model_dir)
    assert model.config.n_positions == TINY["block_size"]
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.eos_token_id == tokenizer.eos_token_id == model.config.bos_token_id
    assert model.config.pad_token_id == tokenizer.pad_token_id
    assert AutoTokenizer.from_pretrained(model_dir).get_vocab() == tokenizer.get_vocab()


def test_sample_is_seeded_and_leaves_the_global_rng_alone(model_dir):
    prompts = ["The plot was", "I thought the", "The acting in this"]
    state = torch.get_rng_state()
    first = base.sample(model_dir, prompts, max_new_tokens=12, seed=3)
    assert torch.equal(torch.get_rng_state(), state)
    assert first == base.sample(model_dir, prompts, max_new_tokens=12, seed=3)
    assert len(first) == 3 and all(isinstance(c, str) and "<|" not in c for c in first)
    assert first != base.sample(model_dir, prompts, max_new_tokens=12, seed=4)


def test_bad_inputs_raise(texts, tokenizer, model_dir, tmp_path):
    with pytest.raises(ConfigError, match="max_new_tokens=40"):
        base.sample(model_dir, ["The plot was"], max_new_tokens=40, seed=0)
    with pytest.raises(ConfigError, match="vocab_size"):
        base.train_tokenizer(texts, vocab_size=100, out_dir=tmp_path)
    with pytest.raises(DataError):
        base.train_tokenizer([], vocab_size=400, out_dir=tmp_path)
    with pytest.raises(DataError, match="block_size=32"):
        base.pretrain(["short"], tokenizer, seed=0, out_dir=tmp_path, progress=False, **TINY)
    with pytest.raises(ConfigError, match="n_head=3"):
        base.pretrain(texts, tokenizer, seed=0, out_dir=tmp_path, progress=False, **{**TINY, "n_head": 3})
