"""The ``base`` stage's models: a tiny GPT-2 pretrained on the world, or a pretrained HF causal LM.

The demo policy starts from a GPT-2 that has learnt the synthetic review world
(``pipeline.data.world``). Everything here is deterministic: the same texts, sizes and seed
give the same tokenizer files and bit-identical weights, so the ``base`` stage replays.
The local-data, smol and paper profiles instead load a pretrained causal LM and its tokenizer
(``base.model``: a local folder, a hub id, or a GGUF file, see ``pipeline.model.gguf``) with
``load_pretrained_model`` / ``load_pretrained_tokenizer``, which turn loading failures into
errors that say what to do.

Defaults (the ``DEFAULT_*`` constants), measured on a shared 2-core CPU: 20k reviews,
vocabulary 1024, 2 layers x 128 wide with 4 heads, block 64, 1200 steps of 16 windows
reach the loss plateau (about 1.90 nats/token) in about 65 s on one thread, and about 97%
of pure-sampled continuations of review prefixes stay grammatical.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from tqdm.auto import tqdm
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

from pipeline.core.errors import ConfigError, DataError
from pipeline.model.gguf import is_gguf_spec, load_gguf_model, load_gguf_tokenizer, resolve_gguf

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"

DEFAULT_N_REVIEWS = 20_000
DEFAULT_VOCAB_SIZE = 1024
DEFAULT_N_LAYER = 2
DEFAULT_N_HEAD = 4
DEFAULT_N_EMBD = 128
DEFAULT_BLOCK_SIZE = 64
DEFAULT_STEPS = 1200
DEFAULT_BATCH_SIZE = 16
DEFAULT_LEARNING_RATE = 3e-3
WARMUP_FRACTION = 0.05
MIN_LR_FRACTION = 0.1


def train_tokenizer(texts: list[str], *, vocab_size: int, out_dir: str | Path) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts`` and save it to ``out_dir``.

    GPT-2 style: ByteLevel pre-tokenizer without a prefix space, ByteLevel decoder, and a
    ByteLevel post-processor with ``trim_offsets`` so that ``return_offsets_mapping`` gives
    each token's characters without the leading space it carries. ``<|endoftext|>`` is the
    bos and eos token, ``<|pad|>`` a distinct pad token. Deterministic for the same inputs.

    Params: texts: training texts; vocab_size: target size including the 256 byte symbols
    and the 2 special tokens; out_dir: directory written with ``save_pretrained``.
    Returns: the tokenizer, as loaded by ``AutoTokenizer.from_pretrained(out_dir)``.
    Raises: DataError if ``texts`` is empty; ConfigError if ``vocab_size`` < 260.
    """
    if not texts:
        raise DataError("tokenizer training texts are empty; pass the generated reviews")
    if vocab_size < 260:
        raise ConfigError(f"vocab_size must be >= 260 (256 bytes + specials), got {vocab_size}; try 1024")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        clean_up_tokenization_spaces=False,
    )
    wrapped.save_pretrained(str(out_dir))
    return wrapped


def _token_stream(texts: list[str], tokenizer: PreTrainedTokenizerFast) -> torch.Tensor:
    """All texts as one 1-D id tensor, each text followed by eos."""
    ids: list[int] = []
    for encoded in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids.extend(encoded)
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def _lr_factor(step: int, steps: int) -> float:
    """Linear warmup over the first WARMUP_FRACTION of steps, then cosine to MIN_LR_FRACTION."""
    warmup = max(1, int(WARMUP_FRACTION * steps))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return MIN_LR_FRACTION + (1 - MIN_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * progress))


def _build_model(tokenizer: PreTrainedTokenizerFast, *, n_layer: int, n_head: int, n_embd: int,
                 block_size: int) -> GPT2LMHeadModel:
    if n_embd % n_head:
        raise ConfigError(f"n_embd={n_embd} must be divisible by n_head={n_head}; try n_embd=128, n_head=4")
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=block_size,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        # No dropout: the world has far more text than this model can memorise, and PPO
        # later recomputes log-probs that must match the behaviour policy's exactly.
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(config)


def pretrain(texts: list[str], tokenizer: PreTrainedTokenizerFast, *, n_layer: int, n_head: int,
             n_embd: int, block_size: int, steps: int, batch_size: int, learning_rate: float,
             seed: int, out_dir: str | Path, progress: bool = True, device="cpu") -> dict:
    """Pretrain a GPT-2 language model from scratch on ``texts`` and save it to ``out_dir``.

    The texts, each followed by eos, are packed into one token stream; every step trains on
    ``batch_size`` random windows of ``block_size`` tokens (starts drawn by a
    ``torch.Generator`` seeded with ``seed``), with AdamW, a short linear warmup and a cosine
    decay. Weights are initialised after ``torch.manual_seed(seed)``, and training runs with
    deterministic algorithms on and one torch thread (both restored afterwards), so the same
    inputs give bit-identical weights on the CPU. On a GPU (``device``) the weights are
    initialised and the windows drawn exactly as on the CPU, then moved there; cuBLAS runs in its
    deterministic workspace mode, so reruns on the same GPU match, but not the CPU's bits.
    Model (safetensors) and tokenizer are written with ``save_pretrained``.

    Params: texts: training texts; tokenizer: from ``train_tokenizer``; n_layer, n_head,
    n_embd, block_size: GPT-2 sizes (block_size is also n_positions); steps, batch_size,
    learning_rate: optimisation; seed: integer seed; out_dir: output directory;
    progress: show a tqdm bar with the loss; device: where the model trains (a torch device).
    Returns: {"final_loss": mean loss of the last 5% of steps, "steps", "seconds", "tokens_seen"}.
    Raises: DataError if the token stream is shorter than one block; ConfigError on bad sizes.
    """
    if steps < 1 or batch_size < 1:
        raise ConfigError(f"steps and batch_size must be >= 1, got steps={steps}, batch_size={batch_size}")
    stream = _token_stream(texts, tokenizer)  # (N,)
    if len(stream) <= block_size + 1:
        raise DataError(f"pretraining texts give {len(stream)} tokens, fewer than block_size={block_size}; "
                        "pass more texts or a smaller block_size")
    device = torch.device(device)
    if device.type == "cuda":  # deterministic cuBLAS needs a fixed workspace, set before its first call
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    was_deterministic, threads = torch.are_deterministic_algorithms_enabled(), torch.get_num_threads()
    torch.use_deterministic_algorithms(True, warn_only=device.type != "cpu")
    # One intra-op thread: reductions then sum in one fixed order whatever the machine's core
    # count, and on a shared 2-core box two threads were up to 10x slower than one.
    torch.set_num_threads(1)
    try:
        torch.manual_seed(seed)
        model = _build_model(tokenizer, n_layer=n_layer, n_head=n_head, n_embd=n_embd,
                             block_size=block_size).to(device)
        stats = _train(model, stream, steps=steps, batch_size=batch_size, block_size=block_size,
                       learning_rate=learning_rate, seed=seed, progress=progress)
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
        torch.set_num_threads(threads)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return stats


def _train(model: GPT2LMHeadModel, stream: torch.Tensor, *, steps: int, batch_size: int,
           block_size: int, learning_rate: float, seed: int, progress: bool) -> dict:
    """The pretraining loop; returns the stats dict of ``pretrain``."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(0.9, 0.95), weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _lr_factor(step, steps))
    offsets = torch.arange(block_size)  # (T,)
    losses: list[float] = []
    model.train()
    started = time.perf_counter()
    bar = tqdm(range(steps), desc="pretrain", disable=not progress)
    for _ in bar:
        starts = torch.randint(0, len(stream) - block_size, (batch_size,), generator=generator)  # (B,)
        windows = stream[starts[:, None] + offsets].to(model.device)  # (B, T), drawn on the CPU
        loss = model(input_ids=windows, labels=windows).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    seconds = time.perf_counter() - started
    tail = losses[-max(1, steps // 20):]
    return {
        "final_loss": sum(tail) / len(tail),
        "steps": steps,
        "seconds": seconds,
        "tokens_seen": steps * batch_size * block_size,
    }


def sample(model_dir: str | Path, prompts: list[str], *, max_new_tokens: int, seed: int) -> list[str]:
    """Sample one continuation per prompt from a saved model (pure ancestral sampling).

    Sampling uses temperature 1, top_k 0 and top_p 1, stops at eos, and runs with the global
    torch RNG forked and seeded with ``seed`` (the caller's RNG state is left unchanged).
    Prompts of equal token length are batched together, so no padding is involved.

    Params: model_dir: a directory written by ``pretrain``; prompts: texts to continue;
    max_new_tokens: tokens to sample at most; seed: integer seed.
    Returns: the continuations (without the prompt and without eos), in prompt order; the
    full text is ``prompt + continuation``.
    Raises: ConfigError if a prompt plus ``max_new_tokens`` exceeds the model's n_positions.
    """
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(model_dir))
    model = GPT2LMHeadModel.from_pretrained(str(model_dir)).eval()
    encoded = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    by_length: dict[int, list[int]] = {}
    for index, ids in enumerate(encoded):
        by_length.setdefault(len(ids), []).append(index)
    continuations = [""] * len(prompts)
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(seed)
        for length, indices in sorted(by_length.items()):
            if length + max_new_tokens > model.config.n_positions:
                raise ConfigError(f"prompt of {length} tokens + max_new_tokens={max_new_tokens} exceeds "
                                  f"n_positions={model.config.n_positions}; lower max_new_tokens")
            input_ids = torch.tensor([encoded[i] for i in indices], dtype=torch.long)  # (B, T)
            output = model.generate(
                input_ids=input_ids, attention_mask=torch.ones_like(input_ids), do_sample=True,
                top_k=0, top_p=1.0, temperature=1.0, max_new_tokens=max_new_tokens,
                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
            )
            for row, index in zip(output[:, length:].tolist(), indices):
                if tokenizer.eos_token_id in row:
                    row = row[: row.index(tokenizer.eos_token_id)]
                continuations[index] = tokenizer.decode(row)
    return continuations


def load_pretrained_tokenizer(name: str, pad_token: str | None = None):
    """The tokenizer of ``base.model`` `name` (a local save_pretrained folder, hub id or GGUF file), with a pad token.

    Params: name: a local folder, a Hugging Face hub id (hub ids need network) or a GGUF spec
    (``pipeline.model.gguf``: a ``.gguf`` path or ``pkg:<package>``);
    pad_token: "eos" = use the eos token as pad when the tokenizer has none (``base.pad_token``).
    Returns: the tokenizer from ``AutoTokenizer.from_pretrained``.
    Raises: ConfigError if it cannot be loaded (offline hub id, missing or wrong folder) or has no
    pad token (the message gives the pad = eos fix the paper's GPT-2 runs used).
    """
    from transformers import AutoTokenizer

    if is_gguf_spec(name):
        tokenizer = load_gguf_tokenizer(resolve_gguf(name, key="base.model"), key="base.model")
    else:
        tokenizer = _from_pretrained(AutoTokenizer.from_pretrained, name, "tokenizer")
    if tokenizer.pad_token_id is None and pad_token == "eos" and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    require_pad_token(tokenizer, name)
    return tokenizer


def load_pretrained_model(name: str):
    """The causal LM of ``base.model`` `name` (``AutoModelForCausalLM.from_pretrained``, its saved dtype).

    A GGUF spec is dequantised to a plain fp32 model (``pipeline.model.gguf.load_gguf_model``).
    Raises: ConfigError if it cannot be loaded (offline hub id, missing folder, not a causal LM,
    a missing or corrupt GGUF file, no gguf reader installed).
    """
    from transformers import AutoModelForCausalLM

    if is_gguf_spec(name):
        return load_gguf_model(resolve_gguf(name, key="base.model"), key="base.model")
    return _from_pretrained(AutoModelForCausalLM.from_pretrained, name, "causal LM")


def require_pad_token(tokenizer, name: str) -> None:
    """Raise ConfigError naming `name` when `tokenizer` has no pad token (drlc pads every batch)."""
    if tokenizer.pad_token_id is None:
        raise ConfigError(
            f"The tokenizer of 'base.model' = {name!r} has no pad token, and drlc pads batches: set "
            f"'base.pad_token: eos' (pad = eos, as the paper's GPT-2 runs did), or save a local copy with a pad token (tok = AutoTokenizer.from_pretrained({name!r}); "
            f"tok.pad_token = tok.eos_token; tok.save_pretrained(DIR); AutoModelForCausalLM.from_pretrained("
            f"{name!r}).save_pretrained(DIR)) and set 'base.model' to DIR.")


def _from_pretrained(loader: Callable, name: str, what: str):
    """loader(name), with OSError/ValueError turned into a ConfigError that says how to fix it."""
    path = Path(name).expanduser()
    if path.is_file():
        raise ConfigError(f"'base.model' = {name!r} is a file: point it at a folder written by save_pretrained, "
                          f"or at a GGUF file (a name ending in .gguf).")
    try:
        return loader(str(path) if path.is_dir() else name)
    except (OSError, ValueError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if path.is_dir():
            raise ConfigError(f"'base.model' = {name!r}: no {what} could be loaded from this folder ({reason}); "
                              f"write one there with save_pretrained.") from err
        raise ConfigError(f"'base.model' = {name!r} is not a local folder and its {what} could not be loaded from "
                          f"the Hugging Face hub ({reason}); without network, save the model and tokenizer with "
                          f"save_pretrained where there is network and set 'base.model' to that local folder.") from err
