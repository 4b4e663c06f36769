"""rollout.engine and its settings fail early, in one line naming the setting and the fix (issue 39).

Unit tier: nothing here starts vLLM. Where vLLM is installed (the `vllm` extra's venv) the missing-vLLM case
skips; tests/test_vllm_rollouts.py runs the engine itself.
"""
import importlib.util
from pathlib import Path

import pytest

from pipeline.core.config import load_params, params_from_dict
from pipeline.core.errors import ConfigError
from pipeline.model.vllm_engine import VLLMEngine
from pipeline.parallel.shard import Shard
from pipeline.steps.engine_rollout import engine_rollout_round

ROOT = Path(__file__).resolve().parents[1]


def raw_params() -> dict:
    import yaml

    return yaml.safe_load((ROOT / "params.yaml").read_text())


def test_the_default_engine_is_drlcs_sampler_and_a_typo_names_the_choices():
    assert load_params(ROOT / "params.yaml").rollout.engine == "hf"
    raw = raw_params()
    raw["rollout"]["engine"] = "vLLM"
    with pytest.raises(ConfigError, match=r"'rollout.engine' = 'vLLM' is out of range: must be one of \('hf', "):
        params_from_dict(raw)
    raw["rollout"].update(engine="vllm", vllm_gpu_memory_utilization=0.0)
    with pytest.raises(ConfigError, match=r"'rollout.vllm_gpu_memory_utilization' = 0.0 is out of range: must be in"):
        params_from_dict(raw)


def test_vllm_args_may_not_set_what_drlc_sets(tmp_path):
    with pytest.raises(ConfigError, match=r"rollout.vllm_args sets \['logprobs_mode', 'seed'\], which drlc sets"):
        VLLMEngine(tmp_path, gpu_memory_utilization=0.2, vllm_args={"seed": 3, "logprobs_mode": "raw_logprobs"})


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here (its venv)")
def test_without_vllm_the_engine_names_the_setting_and_the_install(tmp_path):
    with pytest.raises(ConfigError) as caught:
        VLLMEngine(tmp_path, gpu_memory_utilization=0.2)
    message = str(caught.value)
    assert message.startswith("rollout.engine = vllm: vLLM does not import here") and "\n" not in message
    assert "constraints-vllm.txt" in message and message.endswith("or set rollout.engine: hf.")


def test_an_accelerate_launch_of_the_engine_rollout_is_refused_before_anything_loads(tmp_path):
    rollout = load_params(ROOT / "params.yaml").rollout
    with pytest.raises(ConfigError, match="rollout.engine = vllm runs in one process: launch the rollout stage"):
        engine_rollout_round([], policy_dir=str(tmp_path / "absent"), policy_name="p", run_id="r", round_=1, seed=0,
                             rollout=rollout, shard=Shard(rank=0, world_size=2))
