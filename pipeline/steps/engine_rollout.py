"""The rollout stage with an external engine (rollout.engine: vllm): the policy folder served by vLLM.

Kept apart from pipeline/steps/rollout.py so that the stages that only share its helpers (evaluate's query
encoding) do not depend on the engine's code.
"""
from __future__ import annotations

import json
from pathlib import Path

from pipeline.core.errors import ConfigError
from pipeline.model.lora import ADAPTER_CONFIG, is_adapter_folder
from pipeline.model.policy import load_tokenizer
from pipeline.model.vllm_engine import VLLMEngine
from pipeline.parallel.shard import Shard
from pipeline.steps.rollout import rollout_with


def adapter_rank(policy_dir: str | Path) -> int:
    """The LoRA rank of a LoRA policy folder (adapter_config.json's r); 0 for a full model."""
    if not is_adapter_folder(policy_dir):
        return 0
    return int(json.loads((Path(policy_dir) / ADAPTER_CONFIG).read_text())["r"])


def engine_rollout_round(prompt_rows: list[dict], *, policy_dir: str, policy_name: str, run_id: str, round_: int,
                         seed: int, rollout, shard: Shard | None = None,
                         mixed_precision: str = "fp32") -> tuple[list[dict], dict]:
    """rollout_round's rows and metrics, sampled by a VLLMEngine for `policy_dir` (a LoRA policy: its base, with
    the adapters as a LoRA request). rollout: the params' rollout section; mixed_precision: ppo.mixed_precision
    (the engine's dtype follows it). The metrics add engine_start_s and the engine's device, dtype and sleep mode.

    Raises ConfigError under a multi-process launch (vLLM's own tensor/data parallelism replaces it).
    """
    if shard is not None and shard.world_size > 1:
        raise ConfigError("rollout.engine = vllm runs in one process: launch the rollout stage without "
                          "`accelerate launch`, and set rollout.vllm_args tensor_parallel_size for more devices "
                          "(docs/scale-out.md).")
    tokenizer = load_tokenizer(policy_dir)
    with VLLMEngine.for_rollout(policy_dir, rollout, lora_rank=adapter_rank(policy_dir), seed=seed,
                                mixed_precision=mixed_precision) as engine:
        rows, metrics = rollout_with(
            engine, tokenizer, prompt_rows, policy_name=policy_name, run_id=run_id, round_=round_, seed=seed,
            batch_size=rollout.batch_size, max_new_tokens=rollout.max_new_tokens,
            generation_batch_size=rollout.generation_batch_size, min_new_tokens=rollout.min_new_tokens,
            samples_per_prompt=rollout.samples_per_prompt)
    return rows, {**metrics, **engine.describe(), "engine_start_s": engine.start_s}
