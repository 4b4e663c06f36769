"""`base` stage: train the tokenizer and pretrain the tiny GPT-2 that every round starts from."""
from __future__ import annotations

from pathlib import Path

from pipeline.base import pretrain, train_tokenizer


def build_base_model(corpus: list[str], *, out_dir: str | Path, seed: int, vocab_size: int, n_layer: int,
                     n_head: int, n_embd: int, block_size: int, steps: int, batch_size: int,
                     learning_rate: float) -> dict:
    """Train a byte-level BPE on the corpus, pretrain a GPT-2 on it, save both to out_dir.

    Returns the pretraining stats (final loss, seconds, tokens seen).
    """
    tokenizer = train_tokenizer(corpus, vocab_size=vocab_size, out_dir=out_dir)
    return pretrain(
        corpus, tokenizer, n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size,
        steps=steps, batch_size=batch_size, learning_rate=learning_rate, seed=seed, out_dir=out_dir,
    )
