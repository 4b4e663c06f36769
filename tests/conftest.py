"""Shared test helpers: a small byte-level BPE tokenizer, a tiny GPT-2 saved like a hub model, and a
fresh critic cache per test."""
import os
import shutil
import subprocess
import tempfile

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

from e2e import SHARED_CACHE

from pipeline.core.cache import CriticCache


def pytest_addoption(parser):
    parser.addoption("--long", action="store_true",
                     help="also run the tests marked `long` (the long tier: docs/testing.md)")


UNIT_TIER = 'python -m pytest -q -m "not slow"'


@pytest.fixture(autouse=True)
def _unit_tier_spawns_nothing(request, monkeypatch):
    """The unit tier (README: tests not marked `slow`) starts no process: no stage script, no `dvc`,
    no launcher. A test that must spawn one is marked `slow`; one that only needs the logic calls the
    function in-process. This fixture makes the first careless spawn fail, naming the command."""
    if "slow" in request.keywords:
        return

    def refuse(self, args, *rest, **kwargs):
        shown = " ".join(map(str, args)) if isinstance(args, (list, tuple)) else str(args)
        raise AssertionError(f"a unit-tier test started a process ({shown[:200]}): mark the test "
                             f"@pytest.mark.slow, or call the code in-process ({UNIT_TIER} must spawn nothing)")

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)


def pytest_configure(config):
    """One DVC cache for the session's test projects (tests/e2e.py restore_base): each task and config
    pretrains its base once. Export DRLC_TEST_DVC_CACHE=<folder> to keep it across sessions.

    Also builds what a library builds on first use with a child process, before any test's spawn guard is on:
    matplotlib lists the system fonts with `fc-list` the first time it is imported under a home that has no
    font cache yet (a new user's machine, CI's fresh home). Built once here, it is read from disk after."""
    warm_matplotlib_font_cache()
    if not os.environ.get(SHARED_CACHE):
        folder = tempfile.mkdtemp(prefix="drlc-test-dvc-cache-")
        os.environ[SHARED_CACHE] = folder
        config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


def warm_matplotlib_font_cache() -> None:
    """Import matplotlib's font manager once (it writes fontlist-*.json under MPLCONFIGDIR, running fc-list)."""
    try:
        import matplotlib.font_manager  # noqa: F401  (the import builds the cache)
    except ImportError:  # matplotlib is in the test extra; without it the plotting tests skip on their own
        pass


def pytest_collection_modifyitems(config, items):
    """`long` tests skip, each with the way to run it, unless --long: README's command and CI stay near 36 min."""
    if config.getoption("--long"):
        return
    skip = pytest.mark.skip(reason="long tier: run with `python -m pytest -q --long` (README, Two commands)")
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)


def train_bpe(texts: list[str], vocab_size: int = 300) -> PreTrainedTokenizerFast:
    """A GPT-2 style byte-level BPE (leading-space marker Ġ) trained on `texts` (no hub download)."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")


def save_tiny_gpt2(out, tokenizer, *, n_layer: int = 1, n_positions: int = 64) -> str:
    """A seeded GPT-2 (32 wide, 2 heads) sized to `tokenizer`, saved with it in save_pretrained layout.

    bos = eos = the tokenizer's eos (GPT-2's convention); returns the folder as a string.
    """
    torch.manual_seed(0)
    eos = tokenizer.eos_token_id
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=n_positions, n_embd=32, n_layer=n_layer, n_head=2,
                        bos_token_id=eos, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
    GPT2LMHeadModel(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


@pytest.fixture
def cache(tmp_path):
    """An empty critic cache in the test's temp folder."""
    with CriticCache(tmp_path / "cache") as opened:
        yield opened


REVIEW_PROMPTS = [{"prompt_id": f"train-{i:05d}", "split": "train", "text": text}
                  for i, text in enumerate(["The film was", "I thought the acting", "Overall the plot", "This movie"] * 6)]
"""24 train prompts (4 openings, 6 times each) for rollout tests on a tiny policy."""


def tiny_review_policy(tmp_path_factory) -> str:
    """A 1-layer GPT-2 with a 300-token tokenizer trained on the synthetic reviews (1 torch thread)."""
    from pipeline.data.world import generate_reviews
    from pipeline.model.pretrain import train_tokenizer

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("policy")
    return save_tiny_gpt2(out, train_tokenizer(generate_reviews(300, seed=0), vocab_size=300, out_dir=out))
