"""The vLLM engine's precision and device, data parallelism refused, and a log-prob count that does not match the
tokens (issue 46, items 1, 3 and 5). Unit tier: pure functions and vLLM-shaped outputs built here; nothing starts
vLLM (tests/test_vllm_rollouts.py runs it).
"""
from types import SimpleNamespace

import pytest

from pipeline.core.config import load_params
from pipeline.core.errors import ConfigError, DataError
from pipeline.model.vllm_engine import (
    VLLMEngine,
    _sample_of,
    engine_dtype,
    engine_visible_devices,
    pin_engine_device,
)
from tests.test_vllm_settings import ROOT


@pytest.mark.parametrize("precision, device, dtype", [
    ("fp32", "cpu", "float32"),  # today's CPU runs: the gap to the trainer is float noise
    ("bf16", "cpu", "bfloat16"),  # the engine follows a bf16 policy
    ("fp32", "cuda", "bfloat16"),  # on a GPU: vLLM's LoRA kernels and fast attention want 16 bit
    ("bf16", "cuda", "bfloat16"),
])
def test_the_engine_dtype_follows_the_policy_precision_and_the_device(precision, device, dtype):
    assert engine_dtype(precision, device) == dtype


@pytest.mark.parametrize("setting, visible, tp, expected", [
    ("cuda:1", None, 1, ("1", "cuda:0")),  # vLLM takes the first visible GPU: make it GPU 1
    ("cuda:1", "4,5,6", 1, ("5", "cuda:0")),  # the 2nd of the visible ones
    ("cuda:0", "3,2", 2, ("3,2", "cuda:0")),  # tensor parallel: the GPUs from N on
    ("cuda", None, 1, (None, "cuda")),  # the first visible GPU is vLLM's own choice already
    ("auto", "1", 1, (None, "auto")),
    ("cpu", None, 1, (None, "cpu")),
])
def test_run_device_becomes_the_only_visible_gpu(setting, visible, tp, expected):
    assert engine_visible_devices(setting, visible, tp) == expected


def test_too_few_visible_gpus_for_the_device_and_tensor_parallel_size_is_one_line():
    with pytest.raises(ConfigError, match=r"run.device = cuda:1 with tensor_parallel_size 2 needs GPUs 1..2 of "
                                          r"CUDA_VISIBLE_DEVICES='0,1'"):
        engine_visible_devices("cuda:1", "0,1", 2)


def test_the_hf_engine_and_a_cpu_run_leave_params_and_the_environment_alone(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    params = load_params(ROOT / "params.yaml")
    assert pin_engine_device(params) is params  # engine hf
    import dataclasses

    vllm_cpu = dataclasses.replace(params, rollout=dataclasses.replace(params.rollout, engine="vllm"),
                                   run=dataclasses.replace(params.run, device="cpu"))
    assert pin_engine_device(vllm_cpu) is vllm_cpu
    import os

    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_data_parallel_inside_one_engine_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"data_parallel_size = 2: one offline vLLM engine does not run replicas"):
        VLLMEngine(tmp_path, gpu_memory_utilization=0.2, vllm_args={"data_parallel_size": 2})


def completion(ids, logprobs):
    return SimpleNamespace(token_ids=ids, logprobs=[{t: SimpleNamespace(logprob=lp)} for t, lp in zip(ids, logprobs)])


def test_each_token_gets_its_logprob():
    assert _sample_of(completion([5, 7], [-0.5, -1.5]), 0) == {"response_ids": [5, 7], "engine_logprobs": [-0.5, -1.5]}


def test_fewer_logprobs_than_tokens_is_an_error_naming_the_request():
    short = completion([5, 7, 9], [-0.5, -1.5])  # the third token's log-prob is missing
    with pytest.raises(DataError, match=r"vLLM returned 2 log-probs for the 3 tokens of rollout request 4"):
        _sample_of(short, 4)


def vllm_params(max_new_tokens: int, vllm_args: dict | None = None):
    import dataclasses

    params = load_params(ROOT / "params.yaml")
    rollout = dataclasses.replace(params.rollout, engine="vllm", max_new_tokens=max_new_tokens,
                                  vllm_args=vllm_args or {})
    return dataclasses.replace(params, rollout=rollout)


def test_check_refuses_max_new_tokens_above_max_model_len_before_any_folder_exists(tmp_path):
    from pipeline.steps.engine_rollout import check_engine_lengths

    check_engine_lengths(vllm_params(2048), tmp_path)  # the default cap, 2048, holds it (no prompts known yet)
    with pytest.raises(ConfigError, match=r"rollout.max_new_tokens = 2049 plus the longest prompt \(0 tokens\) is "
                                          r"above the vLLM engine's max_model_len = 2048"):
        check_engine_lengths(vllm_params(2049), tmp_path)
    with pytest.raises(ConfigError, match=r"max_new_tokens = 40 .* max_model_len = 32"):
        check_engine_lengths(vllm_params(40, {"max_model_len": 32}), tmp_path)


def test_check_counts_the_longest_prompt_against_the_models_context(tmp_path):
    from pipeline.core import store
    from pipeline.steps.engine_rollout import check_engine_lengths
    from pipeline.steps.rollout import encode_query
    from tests.conftest import save_tiny_gpt2, train_bpe

    texts = ["the film was good", "a long review " * 5]
    tokenizer = train_bpe(texts * 10)
    tokenizer.pad_token = tokenizer.eos_token
    save_tiny_gpt2(tmp_path / "models" / "base", tokenizer, n_positions=64)  # max_model_len 64
    store.write_table([{"run_id": "r", "round": 0, "prompt_id": f"train-{i}", "split": "train", "text": t,
                       "reference": None} for i, t in enumerate(texts)],
                      "prompts", tmp_path / "data" / "prompts" / "round=0000")
    longest = len(encode_query(tokenizer, texts[1]))
    check_engine_lengths(vllm_params(64 - longest), tmp_path)  # exactly full
    with pytest.raises(ConfigError, match=rf"plus the longest prompt \({longest} tokens\) is above .* = 64"):
        check_engine_lengths(vllm_params(65 - longest), tmp_path)
    check_engine_lengths(dataclasses_replace_engine(vllm_params(500), "hf"), tmp_path)  # the hf engine: no limit


def dataclasses_replace_engine(params, engine):
    import dataclasses

    return dataclasses.replace(params, rollout=dataclasses.replace(params.rollout, engine=engine))
