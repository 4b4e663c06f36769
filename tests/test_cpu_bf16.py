"""bf16 on a CPU without native bf16 warns once, naming the fix; a CPU with it does not warn."""
import warnings

import torch

from pipeline.model import logprobs


def _autocast_twice():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            with logprobs.autocast_context("bf16", torch.device("cpu")):
                pass
    return [str(w.message) for w in caught]


def test_emulated_bf16_warns_once_with_the_fix(monkeypatch):
    monkeypatch.setattr(logprobs, "cpu_has_native_bf16", lambda: False)
    logprobs._warn_slow_cpu_bf16.cache_clear()
    messages = _autocast_twice()
    assert len(messages) == 1 and "ppo.mixed_precision: fp32" in messages[0]
    logprobs._warn_slow_cpu_bf16.cache_clear()


def test_native_bf16_and_fp32_do_not_warn(monkeypatch):
    monkeypatch.setattr(logprobs, "cpu_has_native_bf16", lambda: True)
    logprobs._warn_slow_cpu_bf16.cache_clear()
    assert _autocast_twice() == []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with logprobs.autocast_context("fp32", torch.device("cpu")):
            pass
    assert caught == []

