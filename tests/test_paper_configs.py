"""The paper's runs as params files (configs/paper/) and the accelerate configs (configs/accelerate/).

Checks that every profile validates, that the paper files are complete and carry the settings of
the paper's runs, that their header comments agree with `drlc estimate`, and that the accelerate
files load with accelerate's own loader (the multi-GPU one launches two processes on CPU).
"""
from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.commands.estimate import estimate_critic
from pipeline.core.config import SECTIONS, load_params, read_yaml

ROOT = Path(__file__).resolve().parents[1]
PAPER = sorted((ROOT / "configs" / "paper").glob("*.yaml"))
PROFILES = sorted((ROOT / "configs").glob("*.yaml"))
ACCELERATE = sorted((ROOT / "configs" / "accelerate").glob("*.yaml"))
EXPECTED_PAPER = {
    "sentiment-baseline", "sentiment-dense", "detox-baseline", "detox-dense", "self-critique",
    "summarization-sft", "summarization-rouge-baseline", "summarization-rouge-dense",
    "summarization-rm-baseline", "summarization-rm-dense", "prompting-baseline",
}


def paper(name: str):
    return load_params(ROOT / "configs" / "paper" / f"{name}.yaml")


def test_every_paper_run_has_a_config():
    assert {p.stem for p in PAPER} == EXPECTED_PAPER


@pytest.mark.parametrize("path", PAPER + PROFILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_config_validates(path):
    params = load_params(path)
    assert params.evaluate.policy == f"round={params.round_keys()[-1]}"


@pytest.mark.parametrize("path", PAPER + PROFILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_config_is_complete(path):
    """Every section and every key is written out, as in params.yaml: nothing silently defaulted."""
    raw = read_yaml(path.read_text())
    assert list(raw) == [*SECTIONS, "rounds", "chunks", "distill", "switch"]
    for name, cls in SECTIONS.items():
        assert set(raw[name]) == {f.name for f in dataclasses.fields(cls)}, name


def _header(path: Path) -> str:
    return "\n".join(line for line in path.read_text().splitlines() if line.startswith("#"))


@pytest.mark.parametrize("path", PAPER, ids=lambda p: p.name)
def test_header_documents_calls_and_cost_as_estimated(path):
    params, header = load_params(path), _header(path)
    assert "Expected critic calls and cost" in header and "arXiv 2401.07382" in header
    est = estimate_critic(params, root=ROOT)
    if not params.critic.enabled:
        assert "0 critic calls, $0" in header
        return
    assert f"= {est.calls:g} calls" in header
    if params.critic.endpoint != "local":
        assert f"cost ~${est.usd:.2f} (upper bound ${est.usd_upper_bound:.2f}" in header


def _passes(params) -> float:
    """Passes over the prompt pool that the rounds make: rounds x batch / pool."""
    return len(params.rounds) * params.rollout.batch_size / params.world.n_train_prompts


@pytest.mark.parametrize("dense", [False, True])
def test_sentiment_settings(dense):
    p = paper("sentiment-dense" if dense else "sentiment-baseline")
    assert (p.base.model, p.world.source, p.world.prefix_unit) == ("gpt2-large", "hub:stanfordnlp/imdb:train", "tokens")
    assert (p.world.prefix_min_words, p.world.prefix_max_words, p.world.min_text_chars) == (4, 10, 200)
    assert (p.score.scorer, p.score.model, p.score.label) == ("hf_classifier", "lvwerra/distilbert-imdb", "POSITIVE")
    assert (p.rollout.batch_size, p.rollout.min_new_tokens, p.rollout.max_new_tokens) == (16, 15, 20)
    assert (p.ppo.num_shared_layers, p.ppo.learning_rate, p.ppo.ppo_epochs) == (20, 1.41e-5, 4)
    assert _passes(p) == 2
    assert p.critic.enabled is dense
    assert (p.critic.model, p.critic.endpoint) == ("gpt-3.5-turbo", "https://api.openai.com/v1")
    assert p.critic.threshold == 10 and p.critic.rewards == {"positive": 0.5, "negative": -0.5}


@pytest.mark.parametrize("dense", [False, True])
def test_detox_settings(dense):
    p = paper("detox-dense" if dense else "detox-baseline")
    assert (p.base.model, p.run.task, p.world.min_prompt_toxicity) == ("gpt2-large", "toxicity", 0.6)
    assert p.score.scorer == "perspective"
    assert (p.rollout.batch_size, p.rollout.min_new_tokens, p.rollout.max_new_tokens) == (32, 10, 14)
    assert _passes(p) == 5
    assert p.critic.enabled is dense and p.critic.threshold == 1.0 and p.critic.rewards == {"toxic": -0.5}


def test_self_critique_settings():
    p = paper("self-critique")
    assert (p.base.model, p.base.lora_r, p.base.lora_alpha) == ("meta-llama/Llama-2-7b-chat-hf", 16, 32.0)
    c = p.critic
    assert (c.enabled, c.endpoint, c.backend, c.model_dir, c.temperature, c.threshold) == (
        True, "local", "hf", "base", 0.0, 0.9)
    assert (p.rollout.batch_size, p.ppo.mini_batch_size, p.ppo.gradient_accumulation_steps) == (16, 8, 2)
    assert p.ppo.num_shared_layers is None  # the reference is the model with its adapters disabled
    assert _passes(p) == 3


def test_summarization_settings():
    sft = paper("summarization-sft")
    assert sft.base.model == "gpt2-medium" and sft.base.sft_steps > 0
    assert sft.world.source == "hub:CarperAI/openai_summarize_tldr:train"
    for name in ("rouge-baseline", "rouge-dense", "rm-baseline", "rm-dense"):
        p = paper(f"summarization-{name}")
        # same seed and base section as the SFT config: DVC's run cache reuses one SFT model
        assert (p.run.seed, p.base, p.world.source) == (sft.run.seed, sft.base, sft.world.source)
        assert (p.rollout.batch_size, p.rollout.min_new_tokens, p.rollout.max_new_tokens) == (8, 30, 50)
        assert (p.ppo.num_shared_layers, p.ppo.use_score_scaling) == (12, True)
        assert p.critic.enabled is name.endswith("dense") and p.critic.threshold == 100
        rm = name.startswith("rm")
        assert p.score.scorer == ("reward_model" if rm else "rouge1") and p.score.normalize is rm
        assert (p.evaluate.reward_model is not None) is rm and (p.score.model == p.evaluate.reward_model)


def test_prompting_baseline_is_evaluation_only():
    p = paper("prompting-baseline")
    assert not p.critic.enabled and len(p.rounds) == 1 and p.run.task == "toxicity"
    assert "Continuation:" in p.evaluate.instruction and p.evaluate.instruction.endswith("Text: ")
    assert p.base.lora_r == 16 and p.base.sft_steps == 0  # the placeholder round trains adapters only


def test_accelerate_configs_load_with_accelerate():
    from accelerate.commands.config.config_args import load_config_from_file

    loaded = {path.stem: load_config_from_file(str(path)) for path in ACCELERATE}
    assert set(loaded) == {"multi_gpu", "multi_gpu_bf16", "multi_node", "fsdp2", "zero1", "zero2", "zero3"}
    data_parallel = {name for name, config in loaded.items() if config.distributed_type == "MULTI_GPU"}
    assert data_parallel == {"multi_gpu", "multi_gpu_bf16", "multi_node"}
    assert loaded["fsdp2"].distributed_type == "FSDP" and loaded["fsdp2"].fsdp_config["fsdp_version"] == 2
    assert [loaded[f"zero{stage}"].deepspeed_config["zero_stage"] for stage in (1, 2, 3)] == [1, 2, 3]
    assert all(loaded[f"zero{stage}"].distributed_type == "DEEPSPEED" for stage in (1, 2, 3))
    assert loaded["multi_gpu_bf16"].mixed_precision == "bf16"
    assert loaded["multi_node"].num_machines == 2


PROBE = """
import torch
from pipeline.parallel.distributed import DataParallel
dp = DataParallel.from_environment()
total = dp.all_reduce_sum(torch.tensor([float(dp.rank + 1)]))
dp.close()
with open(f"{out}/rank{{dp.rank}}.txt", "w") as f:  # one file per rank: a shared stdout interleaves
    f.write(f"rank={{dp.rank}} world={{dp.world_size}} sum={{total.item():g}}")
"""


@pytest.mark.slow  # a 2-process accelerate launch
def test_multi_gpu_config_launches_two_processes_on_cpu(tmp_path):
    """The config file gives drlc's DataParallel two ranks (gloo on CPU) whose all-reduce sums 1 + 2."""
    script = tmp_path / "probe.py"
    script.write_text(PROBE.format(out=str(tmp_path)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launcher = Path(sys.executable).with_name("accelerate")
    with socket.socket() as probe:  # a free port: the default 29500 may be held by another launch
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = subprocess.run([str(launcher), "launch", "--config_file", str(ROOT / "configs/accelerate/multi_gpu.yaml"),
                           "--main_process_port", str(port), str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = sorted(path.read_text() for path in tmp_path.glob("rank*.txt"))
    assert lines == ["rank=0 world=2 sum=3", "rank=1 world=2 sum=3"]
