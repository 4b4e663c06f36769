"""Supervised fine-tuning of the base model on the task corpus with TRL's SFTTrainer.

The paper's summarization runs start PPO from GPT-2 fine-tuned on Reddit TL;DR; drlc does it
in the ``base`` stage when ``base.sft_steps`` > 0. Each corpus line is one training text (for
summarization "document TL;DR: reference"), trained with the plain language-modelling loss on
every token (TRL appends eos), as the research code's SFT did on prompt + label.

The model trains on the ``device`` given (``run.device``): Trainer's ``use_cpu`` for the CPU, the
current CUDA device (set to it first) for a GPU. bf16 only on a CUDA GPU that supports it (never
on CPU), no gradient
checkpointing, no logging integrations (``report_to="none"``), no checkpoints (the caller
saves the final model), one process. ``corpus_loss`` measures the mean token loss on fixed
lines so the effect of fine-tuning can be checked before and after.
"""
from __future__ import annotations

import random
import tempfile
import time

import torch

from pipeline.core.errors import ConfigError, DataError

DEFAULT_MAX_LENGTH = 1024  # TRL's SFTConfig default; a model with fewer positions lowers it
EVAL_LINES = 64  # corpus lines (seeded sample) on which the loss is measured before and after


def context_length(model) -> int:
    """Tokens per training text: the model's position limit, at most DEFAULT_MAX_LENGTH."""
    config = model.config
    limit = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
    return min(limit or DEFAULT_MAX_LENGTH, DEFAULT_MAX_LENGTH)


@torch.no_grad()
def corpus_loss(model, tokenizer, texts: list[str], *, max_length: int, batch_size: int = 8) -> float:
    """Mean next-token loss (nats/token) of `model` on `texts`, each followed by eos, dropout off.

    Texts are truncated to `max_length` tokens and right-padded; padding is not scored.
    Params: model: a causal LM; tokenizer: its tokenizer (needs a pad token); texts: non-empty list;
    max_length: tokens per text at most; batch_size: texts per forward pass.
    Returns: the sum of token losses divided by the number of scored tokens.
    """
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    device = next(model.parameters()).device
    for start in range(0, len(texts), batch_size):
        chunk = [t + tokenizer.eos_token for t in texts[start:start + batch_size]]
        batch = tokenizer(chunk, add_special_tokens=False, truncation=True, max_length=max_length,
                          padding=True, return_tensors="pt").to(device)
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)  # (B, L)
        logits = model(**batch).logits[:, :-1].float()  # (B, L - 1, V)
        targets = labels[:, 1:]  # (B, L - 1)
        losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, ignore_index=-100,
                                                   reduction="sum")
        total += losses.item()
        count += int((targets != -100).sum())
    model.train(was_training)
    return total / max(count, 1)


def supervised_finetune(model, tokenizer, texts: list[str], *, steps: int, batch_size: int,
                        learning_rate: float, seed: int, progress: bool = True, device="cpu") -> dict:
    """Fine-tune `model` in place on `texts` for `steps` optimizer steps with TRL's SFTTrainer.

    Seeded (``seed`` drives TRL/transformers' ``set_seed``, the data order and the dropout), linear
    learning-rate decay with no warmup (TRL's default schedule), AdamW; one text per row,
    truncated to ``context_length(model)`` tokens, no packing. The loss is measured with
    ``corpus_loss`` on the same EVAL_LINES corpus lines (a seeded sample) before and after.

    Params: model: a causal LM (trained in place); tokenizer: its tokenizer, with a pad token;
    texts: the training corpus; steps: optimizer steps (> 0); batch_size: texts per step;
    learning_rate: peak learning rate; seed: integer seed; progress: show TRL's progress bar;
    device: where the model trains (it is moved there before the first loss).
    Returns: {"sft_steps", "sft_train_loss" (mean loss of the last logged steps), "sft_loss_before",
    "sft_loss_after" (corpus_loss on the sampled lines), "sft_seconds", "device" (where the model's
    parameters were after training)}.
    Raises: DataError if `texts` has no non-blank line; ConfigError if steps or batch_size < 1 or
    the tokenizer has no pad token.
    """
    from datasets import Dataset
    from trl import SFTTrainer

    texts = [t for t in texts if t.strip()]
    if not texts:
        raise DataError("The SFT corpus (data/corpus/corpus.txt) has no non-blank line: run the prepare stage "
                        "on a data source with text.")
    if steps < 1 or batch_size < 1:
        raise ConfigError(f"SFT needs 'base.sft_steps' and 'base.batch_size' >= 1, got {steps} and {batch_size}.")
    if tokenizer.pad_token_id is None:
        raise ConfigError("SFT needs a tokenizer with a pad token: set pad = eos and save the tokenizer again.")
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # Trainer places a single-process model on the current CUDA device
    model.to(device)
    max_length = context_length(model)
    eval_lines = random.Random(f"drlc-sft-eval:{seed}").sample(texts, min(EVAL_LINES, len(texts)))
    loss_before = corpus_loss(model, tokenizer, eval_lines, max_length=max_length)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="drlc-sft-") as scratch:
        trainer = SFTTrainer(model=model, processing_class=tokenizer,
                             train_dataset=Dataset.from_dict({"text": texts}),
                             args=_sft_config(scratch, steps=steps, batch_size=batch_size,
                                              learning_rate=learning_rate, seed=seed, max_length=max_length,
                                              progress=progress, device=device))
        trainer.train()
    seconds = time.perf_counter() - started
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    tail = logged[-max(1, len(logged) // 5):] if logged else [float("nan")]
    return {"sft_steps": steps, "sft_train_loss": sum(tail) / len(tail), "sft_loss_before": loss_before,
            "sft_loss_after": corpus_loss(model, tokenizer, eval_lines, max_length=max_length),
            "sft_seconds": seconds, "device": str(next(model.parameters()).device)}


def _sft_config(output_dir: str, *, steps: int, batch_size: int, learning_rate: float, seed: int,
                max_length: int, progress: bool, device: torch.device):
    """SFTConfig for a short, checkpoint-free, integration-free run on `device` (see the module docstring)."""
    from trl import SFTConfig

    on_gpu = device.type == "cuda"
    bf16 = on_gpu and torch.cuda.is_bf16_supported()
    return SFTConfig(
        output_dir=output_dir, max_steps=steps, per_device_train_batch_size=batch_size,
        learning_rate=learning_rate, seed=seed, data_seed=seed, bf16=bf16, fp16=False,
        activation_checkpointing=False, report_to="none", save_strategy="no", logging_steps=max(1, steps // 20),
        disable_tqdm=not progress, max_length=max_length, packing=False, dataset_text_field="text",
        dataloader_num_workers=0, dataloader_pin_memory=on_gpu, use_cpu=not on_gpu,
    )
