"""The ``tagger`` backend of the local critic server: a distilled span tagger answers critic requests.

It reads the same rendered prompt an LLM reads: the ``Task: <task>`` line of the system
message names the task, and the text to critique is the ``<response>`` block of the last
user message (``<summary>`` for summarization). The tagger's spans are written in the
templates' own answer format (:func:`pipeline.critic.parse.format_answer`), so the client,
cache, parser and aligner treat it as any other critic. A span holding a double quote (which
the format cannot carry) is cut at the quotes into its parts.

Requests are batched like the hf backend's: a thread that finds no batch running takes the
queued requests (up to ``max_batch_size``) and tags them together; the answers do not depend
on the batch (each text is tagged on its own).

The model folder is loaded once, at server start; a missing or incompatible folder is a
one-line :class:`CriticError` naming the path and the labels expected (the template's,
given as ``labels``, or every label of the tasks the backend knows).
"""
from __future__ import annotations

import re
import threading

from pipeline.core.errors import CriticError
from pipeline.critic.offline.protocol import Completion, content_text
from pipeline.critic.offline.tagger import SpanTagger, model_hash
from pipeline.critic.parse import format_answer
from pipeline.critic.structured import requested_span_limit, spans_json

__all__ = ["SEED_FIELD", "RandomSpanBackend", "TaggerBackend", "critiqued_text", "request_seed"]

_TASK_LINE = re.compile(r"^Task:[ \t]*(\S+)[ \t]*$", re.MULTILINE)
_BLOCKS = {"summarization": "summary"}  # the block holding the text to critique; "response" otherwise


def critiqued_text(messages: list[dict]) -> str:
    """The text a rendered critic prompt asks about: its ``<response>`` (or ``<summary>``) block,
    from the last ``<response>`` line before the last ``</response>``, minus one newline each side.

    :raises CriticError: no user message, or the block is missing
    """
    task = next((m.group(1) for message in messages if message.get("role") == "system"
                 for m in [_TASK_LINE.search(content_text(message.get("content")))] if m), None)
    tag = _BLOCKS.get(task, "response")
    users = [content_text(m.get("content")) for m in messages if m.get("role") == "user"]
    if not users:
        raise CriticError("tagger critic: the request has no user message; render the prompt from prompts/")
    text, opening, closing = users[-1], f"<{tag}>", f"</{tag}>"
    end = text.rfind(closing)
    # the block opens at the last "<tag>" on its own line before the closing tag: the
    # instructions may name the tag in prose ("the text between the <response> tags")
    start = text.rfind(opening + "\n", 0, max(end, 0))
    start = start if start >= 0 else text.rfind(opening, 0, max(end, 0))
    if start < 0 or end < start + len(opening):
        raise CriticError(f"tagger critic: the last user message has no {opening}...{closing} block")
    inner = text[start + len(opening):end]
    inner = inner.removeprefix("\n")
    return inner.removesuffix("\n")


SEED_FIELD = "drlc_seed"  # the request field seeding the random-span control (set by critic.extra_body)


def request_seed(request: dict) -> int:
    """The request's ``drlc_seed`` field (0 when absent): the random-span backend's seed.

    Not OpenAI's ``seed``, which drlc's client sends itself (a sampling parameter, never in extra_body).

    :raises CriticError: a seed that is not an integer
    """
    seed = request.get(SEED_FIELD, 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise CriticError(f"critic request {SEED_FIELD}={seed!r} is not an integer; set critic.extra_body."
                          f"{SEED_FIELD} to one")
    return seed


class TaggerBackend:
    """``request -> Completion`` answering with the tagger in ``model_dir``, batched across threads.

    :param model_dir: a folder written by `drlc critic distill`
    :param labels: the labels the run's template asks for (None: any); checked against the model
    :param max_batch_size: most requests tagged by one thread in one go
    """

    name = "tagger"
    device = None  # no accelerator: the tagger runs in numpy

    def __init__(self, model_dir, *, labels: tuple[str, ...] | None = None, max_batch_size: int = 64) -> None:
        self.model_dir = str(model_dir)
        self.tagger = SpanTagger.load(model_dir, labels=labels)
        self.model_hash = model_hash(model_dir)
        self.max_batch_size = max_batch_size
        self.batch_sizes: list[int] = []  # the size of every batch tagged so far, in order
        self._queue: list[dict] = []
        self._busy = False
        self._cond = threading.Condition()

    def spans_of(self, text: str, seed: int = 0) -> list[tuple[str, int, int]]:
        """The ``(label, start, end)`` spans this backend names in ``text`` (the tagger's; ``seed`` unused)."""
        return self.tagger.spans(text)

    def answer_text(self, text: str, span_limit: int | None = None, seed: int = 0) -> str:
        """The answer to a critic request about ``text``: the templates' format, or drlc's span JSON
        when the request asked for a structured answer of at most ``span_limit`` spans."""
        spans = []
        for label, start, end in self.spans_of(text, seed):
            spans += [(label, part) for part in text[start:end].split('"') if part.strip()]
        spans = list(dict.fromkeys(spans))
        if span_limit is not None:  # the spans are copied from the response already: copy needs no constraint
            return spans_json(spans, span_limit)
        return format_answer(self.tagger.config.labels, spans)

    def __call__(self, request: dict) -> Completion:
        item = {"messages": request["messages"], "span_limit": requested_span_limit(request),
                "seed": request_seed(request), "answer": None, "error": None, "done": False}
        with self._cond:
            self._queue.append(item)
        while True:
            with self._cond:
                while not item["done"] and self._busy:
                    self._cond.wait()
                if item["done"]:
                    break
                self._busy = True
                batch, self._queue = self._queue[:self.max_batch_size], self._queue[self.max_batch_size:]
            try:
                self._tag(batch)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
        if item["error"] is not None:
            raise item["error"]
        return item["answer"]

    def _tag(self, batch: list[dict]) -> None:
        self.batch_sizes.append(len(batch))
        for item in batch:
            try:
                text = self.answer_text(critiqued_text(item["messages"]), item["span_limit"], item["seed"])
                prompt = sum(len(content_text(m.get("content")).split()) for m in item["messages"])
                item["answer"] = Completion(text=text, prompt_tokens=prompt, completion_tokens=len(text.split()))
            except Exception as error:  # handed to the request's own thread, which re-raises it
                item["error"] = error
            item["done"] = True


class RandomSpanBackend(TaggerBackend):
    """The random-span control: the tagger's spans in ``model_dir``, each moved to a random place
    (:func:`pipeline.critic.offline.random_spans.random_spans`, seeded by the response and the request's
    ``drlc_seed``)."""

    name = "random_spans"

    def spans_of(self, text: str, seed: int = 0) -> list[tuple[str, int, int]]:
        from pipeline.critic.offline.random_spans import random_spans

        return random_spans(text, self.tagger.spans(text), seed=seed)
