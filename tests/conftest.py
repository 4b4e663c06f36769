"""Shared test helpers: a small byte-level BPE tokenizer and a fresh critic cache per test."""
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from pipeline.critic.cache import CriticCache


def train_bpe(texts: list[str], vocab_size: int = 300) -> PreTrainedTokenizerFast:
    """A GPT-2 style byte-level BPE (leading-space marker Ġ) trained on `texts` (no hub download)."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")


@pytest.fixture
def cache(tmp_path):
    """An empty critic cache in the test's temp folder."""
    with CriticCache(tmp_path / "cache") as opened:
        yield opened
