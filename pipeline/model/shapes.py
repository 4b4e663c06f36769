"""Shapes of the hub models the paper configs name, and models built from them on the meta device.

One table for everything that sizes a model offline (nothing downloaded, nothing allocated):
`drlc estimate`'s disk and load-time report (pipeline/commands/estimate.py) and the computed GPU
memory of benchmarks/gpu_memory.py.
"""
from __future__ import annotations

from pathlib import Path

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
# (kind, dtype as from_pretrained loads it, config fields) of each hub model, from its config.json on
# the hub (huggingface.co/<id>/blob/main/config.json); the counts they give are checked in
# tests/test_estimate.py against the published ones (gpt2-large 774,030,080; Llama-2-7b 6,738,415,616).
# dtype "auto" = the checkpoint's: gpt2's config.json names none (fp32), Llama-2-7b-chat-hf's float16.
# kind: "causal" (an LM head), "classifier" (sequence classification) or "trunk" (the bare model).
KNOWN_MODELS = {
    "gpt2": ("causal", "float32", dict(model_type="gpt2", n_layer=12, n_embd=768, n_head=12,
                                       vocab_size=50257, n_positions=1024)),
    "gpt2-medium": ("causal", "float32", dict(model_type="gpt2", n_layer=24, n_embd=1024, n_head=16,
                                              vocab_size=50257, n_positions=1024)),
    "gpt2-large": ("causal", "float32", dict(model_type="gpt2", n_layer=36, n_embd=1280, n_head=20,
                                             vocab_size=50257, n_positions=1024)),
    "meta-llama/Llama-2-7b-chat-hf": ("causal", "float16", dict(
        model_type="llama", hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096,
        tie_word_embeddings=False)),
    "lvwerra/distilbert-imdb": ("classifier", "float32", dict(model_type="distilbert", num_labels=2)),
    # trlx's GPTRewardModel on a GPT-J-6B trunk; its file's dtype is not known offline: fp32 assumed
    # (the larger, so the load share is not understated)
    "CarperAI/openai_summarize_tldr_rm_checkpoint": ("trunk", "float32", dict(
        model_type="gptj", n_embd=4096, n_layer=28, n_head=16, rotary_dim=64, vocab_size=50400,
        n_positions=2048)),
}


def known_config(name: str):
    """(transformers config, kind, dtype name) of hub model `name` from KNOWN_MODELS, or None.

    `name` matches a table id, or a table id's last part matches its folder name (a local copy).
    """
    known = KNOWN_MODELS.get(name) or next((v for k, v in KNOWN_MODELS.items() if k.split("/")[-1] == Path(name).name),
                                           None)
    if known is None:
        return None
    from transformers import AutoConfig

    kind, dtype, fields = known
    fields = dict(fields)
    return AutoConfig.for_model(fields.pop("model_type"), **fields), kind, dtype


def meta_model(config, kind: str):
    """The model built from `config` on the meta device: shapes and parameter names, no memory, no weights."""
    import torch
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

    builder = {"causal": AutoModelForCausalLM, "classifier": AutoModelForSequenceClassification,
               "trunk": AutoModel}[kind]
    with torch.device("meta"):
        return builder.from_config(config)


def lora_parameter_count(lm, r: int, target_modules: list[str]) -> int:
    """Adapter parameters: r x (in + out) per targeted Linear/Conv1D (peft's defaults when none are given)."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    targets = set(target_modules or DEFAULTS.get(lm.config.model_type, []))
    count = 0
    for name, module in lm.named_modules():
        if name.rsplit(".", 1)[-1] in targets and hasattr(module, "weight") and module.weight.dim() == 2:
            count += r * sum(module.weight.shape)  # Linear (out, in) or GPT-2's Conv1D (in, out)
    return count
