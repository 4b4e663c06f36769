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


def engine_model_len(rollout, model_dir: str | Path | None) -> int:
    """The context the engine is set up for: rollout.vllm_args max_model_len, else the model's own (capped as
    pipeline/model/vllm_engine.py default_model_len does), else that cap when the model folder is not there yet."""
    from pipeline.model.vllm_engine import MAX_MODEL_LEN, default_model_len

    if rollout.vllm_args.get("max_model_len"):
        return int(rollout.vllm_args["max_model_len"])
    if model_dir is not None and (Path(model_dir) / "config.json").is_file():
        return default_model_len(model_dir)
    return MAX_MODEL_LEN


def check_engine_lengths(params, root: str | Path = ".") -> None:
    """`drlc check` for rollout.engine vllm: raise ConfigError when the longest prompt (data/prompts/round=0000,
    encoded as the rollout encodes it, once models/base and the prompts exist) plus rollout.max_new_tokens does not
    fit the engine's max_model_len, which vLLM would refuse mid-rollout. Without those folders, max_new_tokens
    alone is checked."""
    if params.rollout.engine != "vllm":
        return
    base, prompts = Path(root) / "models" / "base", Path(root) / "data" / "prompts" / "round=0000"
    limit, new = engine_model_len(params.rollout, base), params.rollout.max_new_tokens
    longest = 0
    if (base / "config.json").is_file() and prompts.is_dir():
        from pipeline.core import store
        from pipeline.steps.rollout import encode_query

        tokenizer = load_tokenizer(base)
        longest = max((len(encode_query(tokenizer, row["text"])) for row in store.read_table(prompts, "prompts")),
                      default=0)
    if longest + new > limit:
        raise ConfigError(f"rollout.max_new_tokens = {new} plus the longest prompt ({longest} tokens) is above the "
                          f"vLLM engine's max_model_len = {limit}: lower rollout.max_new_tokens, shorten the prompts, "
                          "or raise rollout.vllm_args max_model_len (up to the model's context).")
