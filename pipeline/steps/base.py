"""`base` stage: the model every round starts from, pretrained here or loaded, optionally fine-tuned.

- ``base.model: null`` (demo): train a byte-level BPE on the corpus and pretrain a tiny GPT-2 on it.
- ``base.model`` set: load that causal LM and its tokenizer (a local folder, a hub id when there
  is network, or a GGUF file: ``pipeline.model.gguf``); the tokenizer must have a pad token. A GGUF
  model is converted here, once: every later stage loads the plain checkpoint in `out_dir`, and
  ``gguf_source.json`` there records which file it came from (name, bytes, SHA-256, package version).
- ``base.sft_steps`` > 0: then supervised fine-tuning on the corpus with TRL's SFTTrainer
  (pipeline/model/sft.py), ``base.batch_size`` texts per step at ``base.learning_rate``.

The model and its tokenizer are written to `out_dir` with save_pretrained (no value head: the
first round initialises one, pipeline/model/policy.py).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from pipeline.core.config import BaseParams
from pipeline.model.gguf import describe_gguf, is_gguf_spec, resolve_gguf
from pipeline.model.pretrain import load_pretrained_model, load_pretrained_tokenizer, pretrain, train_tokenizer

GGUF_SOURCE_FILE = "gguf_source.json"


def build_base_model(corpus: list[str], *, out_dir: str | Path, seed: int, base: BaseParams,
                     progress: bool = True, device="cpu") -> dict:
    """Build or load the base model as the module docstring says and save it (and its tokenizer) to out_dir.

    Params: corpus: the task corpus (data/corpus/corpus.txt lines); out_dir: output folder;
    seed: run.seed; base: the BaseParams section; progress: show progress bars; device: where
    pretraining and SFT train (pipeline/model/pretrain.py: bit-reproducible on the CPU).
    Returns: stats: "source" (the model name or "pretrained"), "seconds", "device" (where the last
    model trained; None when nothing trained), and
    the pretraining stats (final_loss, steps, tokens_seen) or the SFT stats (pipeline/model/sft.py)
    when they ran.
    Raises: ConfigError for a model that cannot be loaded or whose tokenizer has no pad token;
    DataError for an empty corpus.
    """
    started = time.perf_counter()
    if base.model is None:
        tokenizer = train_tokenizer(corpus, vocab_size=base.vocab_size, out_dir=out_dir)
        stats = {"source": "pretrained", "device": str(device), **pretrain(
            corpus, tokenizer, n_layer=base.n_layer, n_head=base.n_head, n_embd=base.n_embd,
            block_size=base.block_size, steps=base.steps, batch_size=base.batch_size,
            learning_rate=base.learning_rate, seed=seed, out_dir=out_dir, progress=progress, device=device)}
        if base.sft_steps == 0:
            return {**stats, "seconds": time.perf_counter() - started}
        model_name = str(out_dir)
    else:
        model_name, stats = base.model, {"source": base.model, "device": None}
    tokenizer = load_pretrained_tokenizer(model_name, base.pad_token)
    model = load_pretrained_model(model_name)
    if base.sft_steps > 0:
        from pipeline.model.sft import supervised_finetune

        stats.update(supervised_finetune(model, tokenizer, corpus, steps=base.sft_steps, batch_size=base.batch_size,
                                         learning_rate=base.learning_rate, seed=seed, progress=progress,
                                         device=device))
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    if is_gguf_spec(base.model):
        source = describe_gguf(base.model, resolve_gguf(base.model, key="base.model"))
        (Path(out_dir) / GGUF_SOURCE_FILE).write_text(json.dumps(source, indent=2, sort_keys=True) + "\n")
    return {**stats, "seconds": time.perf_counter() - started}
