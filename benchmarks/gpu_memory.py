"""GPU memory of a PPO process, computed (not measured) from the model's shapes and the params file.

Used for the paper runs' headers (configs/paper/*.yaml, the `# Scale-out:` block) and the table in
docs/scale-out.md (`python benchmarks/gpu_check.py --memory-table`), and put next to the measured
peak in benchmarks/gpu_check.py's ppo_timing step. Models are built on the meta device from
their configs: nothing is downloaded or allocated.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

from pipeline.model.shapes import DTYPE_BYTES, known_config, lora_parameter_count, meta_model

ROOT = Path(__file__).resolve().parents[1]

# Longest query a PPO minibatch pads to, per task (an assumption, not read from data): sentiment =
# world.prefix_max_words tokens; RealToxicityPrompts prompts are sentence halves (32 tokens taken);
# TL;DR prompts are a whole post (512 tokens taken; the mean post is pipeline.commands.estimate's 352).
QUERY_TOKENS = {"toxicity": 32, "summarization": 512}


@functools.lru_cache(maxsize=None)
def _meta_model(name: str):
    """(the causal LM of KNOWN_MODELS[name] on the meta device, bytes per weight as from_pretrained loads it)."""
    known = known_config(name)
    if known is None or known[1] != "causal":
        raise KeyError(f"{name!r} is no causal LM of pipeline/model/shapes.py's KNOWN_MODELS")
    config, kind, dtype = known
    return meta_model(config, kind), DTYPE_BYTES[dtype]


def memory_estimate(model: str, *, lora_r: int = 0, lora_target_modules: tuple = (), num_shared_layers=None,
                    mixed_precision: str = "fp32", mini_batch: int, query_tokens: int, response_tokens: int) -> dict:
    """Computed (not measured) GPU memory of one PPO process, in GB (1e9 bytes), by part.

    weights (as loaded) + grads and Adam's two moments (fp32, trainable parameters only) + the
    reference's own weights (a frozen copy; only its unshared blocks with num_shared_layers; none
    for LoRA) + bf16 autocast's weight copies + activations kept for backward: 34·s·b·h bytes at
    16 bits per trained transformer block (doubled in fp32), b = mini_batch, s = query + response
    tokens (Korthikanti et al. 2022, eq. 1, without its 5·a·s²·b attention-matrix term, which the
    fused SDPA attention kernels do not keep), plus 3 copies of the fp32 response logits (logits,
    the softmax kept for backward, their grad). Left out: the CUDA context and allocator slack (about 1 GB) and the
    no-grad passes (smaller than the training forward). DDP: every process holds all of it;
    ZeRO-3 / FSDP2 over N processes divide weights, grads and Adam by N (`sharded_2_gb`: N = 2).
    """
    from pipeline.model.reference import shared_parameter_names

    lm, weight_bytes = _meta_model(model)
    config = lm.config
    n_params = sum(p.numel() for p in lm.parameters())
    hidden, layers = config.hidden_size, config.num_hidden_layers
    if lora_r > 0:
        trainable, reference, trained_blocks = lora_parameter_count(lm, lora_r, list(lora_target_modules)), 0, layers
    else:
        sizes = {name: p.numel() for name, p in lm.named_parameters()}
        shared = shared_parameter_names(lm, num_shared_layers) if num_shared_layers else []
        trainable = reference = n_params - sum(sizes[name] for name in shared)
        trained_blocks = layers - (num_shared_layers or 0)
    trainable += hidden + 1  # the value head
    s, b = query_tokens + response_tokens, mini_batch
    activation_bytes = 2 if mixed_precision == "bf16" or weight_bytes == 2 else 4
    parts = {
        "weights": n_params * weight_bytes, "grads": trainable * 4, "adam": trainable * 8,
        "reference": reference * weight_bytes,
        "autocast_copies": n_params * 2 if mixed_precision == "bf16" and weight_bytes == 4 else 0,
        "activations": trained_blocks * 34 * s * b * hidden * activation_bytes / 2
                       + 3 * b * response_tokens * config.vocab_size * 4,
    }
    parts = {key: value / 1e9 for key, value in parts.items()}
    sharded = (parts["weights"] + parts["grads"] + parts["adam"]) / 2 + parts["reference"] \
        + parts["autocast_copies"] + parts["activations"]
    return {"model": model, "parameters": n_params, "trainable": trainable, "weight_bytes": weight_bytes,
            "mixed_precision": mixed_precision, "sequence": s, "mini_batch": b,
            **{f"{key}_gb": round(value, 2) for key, value in parts.items()},
            "total_gb": round(sum(parts.values()), 1), "sharded_2_gb": round(sharded, 1)}


def params_memory_estimate(params) -> dict:
    """memory_estimate of the ppo stage of a params file (query length: QUERY_TOKENS, else the prefix)."""
    world = params.world
    prefix = world.prefix_max_words if world.prefix_unit == "tokens" else 2 * world.prefix_max_words
    return memory_estimate(params.base.model, lora_r=params.base.lora_r,
                           lora_target_modules=tuple(params.base.lora_target_modules),
                           num_shared_layers=params.ppo.num_shared_layers, mixed_precision=params.ppo.mixed_precision,
                           mini_batch=params.ppo.mini_batch_size, query_tokens=QUERY_TOKENS.get(params.run.task, prefix),
                           response_tokens=params.rollout.max_new_tokens)


def paper_memory_table() -> dict:
    """{config file name: memory_estimate} for every configs/paper/*.yaml."""
    from pipeline.core.config import load_params

    return {path.name: params_memory_estimate(load_params(path)) for path in sorted((ROOT / "configs" / "paper").glob("*.yaml"))}


if __name__ == "__main__":  # the table of docs/scale-out.md (python benchmarks/gpu_check.py --memory-table runs this)
    print(json.dumps(paper_memory_table(), indent=2))
