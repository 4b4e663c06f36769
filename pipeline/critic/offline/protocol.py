"""What a backend of drlc's critic server is: a function from a chat request to a Completion.

A backend is either ``request -> Completion`` (:data:`CompleteFn`: it counts its own tokens, as
the ``hf`` backend does with its tokenizer) or ``messages -> text`` (:data:`AnswerFn`, which the
server wraps and counts in words). The server (server.py) and every backend import this module;
it imports neither.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

__all__ = ["AnswerFn", "CompleteFn", "Completion", "content_text"]

AnswerFn = Callable[[list[dict]], str]


@dataclass(frozen=True)
class Completion:
    """One backend answer: the text, its token counts and why generation stopped."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str = "stop"


CompleteFn = Callable[[dict], Completion]


def content_text(content: object) -> str:
    """Text of a message content: a string or a list of ``{"type": "text", "text": ...}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""
