"""The base stage: tokenizer training, deterministic tiny GPT-2 pretraining, sampling."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, GPT2LMHeadModel

from pipeline.core.errors import ConfigError, DataError
from pipeline.data import world
from pipeline.model import pretrain

TINY = dict(n_layer=1, n_head=2, n_embd=64, block_size=32, steps=60, batch_size=8, learning_rate=3e-3)


@pytest.fixture(scope="module")
def texts():
    return world.generate_reviews(2000, seed=0)


@pytest.fixture(scope="module")
def tokenizer(texts, tmp_path_factory):
    return pretrain.train_tokenizer(texts, vocab_size=400, out_dir=tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def model_dir(texts, tokenizer, tmp_path_factory):
    out = tmp_path_factory.mktemp("model")
    pretrain.pretrain(texts, tokenizer, seed=0, out_dir=out, progress=False, **TINY)
    return out


def test_tokenizer_special_tokens(tokenizer):
    assert len(tokenizer) == 400
    assert tokenizer.eos_token == tokenizer.bos_token == "<|endoftext|>"
    assert tokenizer.pad_token == "<|pad|>"
    assert tokenizer.pad_token_id != tokenizer.eos_token_id


def test_tokenizer_training_is_deterministic(texts, tokenizer, tmp_path):
    pretrain.train_tokenizer(texts, vocab_size=400, out_dir=tmp_path)
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
    pretrain.train_tokenizer(world.generate_reviews(2000, seed=0), vocab_size=400, out_dir=tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"] == \
        encoded["offset_mapping"]


def test_pretraining_is_bit_identical_for_a_seed(texts, tokenizer, model_dir, tmp_path):
    threads = torch.get_num_threads()
    stats = pretrain.pretrain(texts, tokenizer, seed=0, out_dir=tmp_path / "again", progress=False, **TINY)
    first = load_file(Path(model_dir) / "model.safetensors")
    second = load_file(tmp_path / "again" / "model.safetensors")
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert (Path(model_dir) / "model.safetensors").read_bytes() == (tmp_path / "again" / "model.safetensors").read_bytes()
    assert torch.get_num_threads() == threads and not torch.are_deterministic_algorithms_enabled()
    assert set(stats) == {"final_loss", "steps", "seconds", "tokens_seen"}
    assert stats["tokens_seen"] == TINY["steps"] * TINY["batch_size"] * TINY["block_size"]
    pretrain.pretrain(texts, tokenizer, seed=1, out_dir=tmp_path / "other", progress=False, **TINY)
    other = load_file(tmp_path / "other" / "model.safetensors")
    assert not all(torch.equal(first[k], other[k]) for k in first)


def test_pretraining_learns_and_saves_a_loadable_model(texts, tokenizer, model_dir, tmp_path):
    stats = pretrain.pretrain(texts, tokenizer, seed=0, out_dir=tmp_path, progress=False, **TINY)
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
    first = pretrain.sample(model_dir, prompts, max_new_tokens=12, seed=3)
    assert torch.equal(torch.get_rng_state(), state)
    assert first == pretrain.sample(model_dir, prompts, max_new_tokens=12, seed=3)
    assert len(first) == 3 and all(isinstance(c, str) and "<|" not in c for c in first)
    assert first != pretrain.sample(model_dir, prompts, max_new_tokens=12, seed=4)


def test_bad_inputs_raise(texts, tokenizer, model_dir, tmp_path):
    with pytest.raises(ConfigError, match="max_new_tokens=40"):
        pretrain.sample(model_dir, ["The plot was"], max_new_tokens=40, seed=0)
    with pytest.raises(ConfigError, match="vocab_size"):
        pretrain.train_tokenizer(texts, vocab_size=100, out_dir=tmp_path)
    with pytest.raises(DataError):
        pretrain.train_tokenizer([], vocab_size=400, out_dir=tmp_path)
    with pytest.raises(DataError, match="block_size=32"):
        pretrain.pretrain(["short"], tokenizer, seed=0, out_dir=tmp_path, progress=False, **TINY)
    with pytest.raises(ConfigError, match="n_head=3"):
        pretrain.pretrain(texts, tokenizer, seed=0, out_dir=tmp_path, progress=False, **{**TINY, "n_head": 3})


# ---- base.model: a pretrained causal LM loaded instead of the tiny GPT-2 (pipeline/steps/base.py) ----

import conftest  # noqa: E402
from conftest import train_bpe  # noqa: E402

from pipeline.core.config import BaseParams  # noqa: E402
from pipeline.model.policy import load_policy  # noqa: E402
from pipeline.steps.base import build_base_model  # noqa: E402


@pytest.fixture
def offline(monkeypatch):
    """Hub calls fail at once instead of after minutes of retries (there is no network here anyway)."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def save_tiny_gpt2(out, texts, *, pad_equals_eos: bool) -> str:
    """A GPT-2-style pretrained stand-in: eos-only BPE tokenizer (pad = eos optional) + a 1-layer GPT-2."""
    tokenizer = train_bpe(texts[:300])
    if pad_equals_eos:
        tokenizer.pad_token = tokenizer.eos_token
    return conftest.save_tiny_gpt2(out, tokenizer)


def test_base_model_null_pretrains_the_tiny_gpt2(texts, tmp_path):
    params = BaseParams(vocab_size=400, **{k: v for k, v in TINY.items()})
    stats = build_base_model(texts, out_dir=tmp_path, seed=0, base=params, progress=False)
    assert stats["source"] == "pretrained" and stats["steps"] == TINY["steps"] and stats["seconds"] > 0
    policy, tokenizer = load_policy(tmp_path)
    assert len(tokenizer) == 400 and policy.lm.config.n_layer == TINY["n_layer"]


def test_a_local_pretrained_model_is_saved_as_the_base_with_its_tokenizer(texts, tmp_path):
    source = save_tiny_gpt2(tmp_path / "gpt2", texts, pad_equals_eos=True)
    stats = build_base_model(texts, out_dir=tmp_path / "base", seed=0, base=BaseParams(model=source), progress=False)
    assert stats["source"] == source and "sft_steps" not in stats
    saved, original = load_file(tmp_path / "base" / "model.safetensors"), load_file(tmp_path / "gpt2" / "model.safetensors")
    assert saved.keys() == original.keys() and all(torch.equal(saved[k], original[k]) for k in saved)
    policy, tokenizer = load_policy(tmp_path / "base")
    assert tokenizer.get_vocab() == AutoTokenizer.from_pretrained(source).get_vocab()
    assert tokenizer.pad_token_id == tokenizer.eos_token_id


def test_a_tokenizer_without_pad_token_is_rejected_with_the_fix(texts, tmp_path):
    source = save_tiny_gpt2(tmp_path / "nopad", texts, pad_equals_eos=False)
    assert AutoTokenizer.from_pretrained(source).pad_token is None
    with pytest.raises(ConfigError, match=r"'base.model' = '.*nopad' has no pad token.*tok.pad_token = tok.eos_token"):
        build_base_model(texts, out_dir=tmp_path / "base", seed=0, base=BaseParams(model=source), progress=False)
    assert not (tmp_path / "base").exists()


def test_unloadable_models_say_what_to_do(texts, tmp_path, offline):
    with pytest.raises(ConfigError, match=r"'base.model' = 'openai-community/gpt2-large' is not a local folder.*"
                                          r"hub.*save_pretrained.*local folder"):
        build_base_model(texts, out_dir=tmp_path / "a", seed=0, base=BaseParams(model="openai-community/gpt2-large"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"'base.model' = '.*empty': no tokenizer could be loaded from this folder"):
        build_base_model(texts, out_dir=tmp_path / "b", seed=0, base=BaseParams(model=str(tmp_path / "empty")))
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ConfigError, match="is a file"):
        build_base_model(texts, out_dir=tmp_path / "c", seed=0, base=BaseParams(model=str(tmp_path / "weights.bin")))
