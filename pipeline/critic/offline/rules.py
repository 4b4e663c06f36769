"""The ``rules`` backend of drlc's critic server: the user's own rule critic, a function in a Python file.

``critic.backend: rules`` with ``critic.model_dir: tasks/concepts.py``; the file defines::

    def critic(query, response) -> dict[str, list[str]]   # {label: [span copied from the response, ...]}

Its parameters are named after the ``<name>`` ... ``</name>`` blocks of the rendered template's
user message (the skeleton's template has ``<query>`` and ``<response>``); the backend reads
those blocks from the last user message, as an LLM would read them, calls the function, and
answers in drlc's own format (``Label: "span"; "span"``) for the template's labels. It reads no
model and no network: a task's offline critic. Its cache identity is the hash of the file and of the
tasks/ modules it imports (pipeline/core/code_deps.py code_sha), so an edited rule or helper never
reads the old rule's answers.
"""
from __future__ import annotations

import inspect
import re
from pathlib import Path

from pipeline.core.errors import CriticError
from pipeline.core.user_code import import_file
from pipeline.critic.parse import format_answer

_BLOCK = re.compile(r"<(\w+)>\n?(.*?)\n?</\1>", re.DOTALL)
FUNCTION = "critic"


class RuleBackend:
    """messages -> answer text, by the ``critic`` function of a file, for the template's labels."""

    def __init__(self, path: str | Path, *, labels: tuple[str, ...] | None) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise CriticError(f"critic server backend 'rules': 'critic.model_dir' = '{path}' is not a file: name the "
                              f"Python file that defines {FUNCTION}(query, response).")
        self.function = getattr(import_file(self.path, key="critic.model_dir"), FUNCTION, None)
        if not callable(self.function):
            raise CriticError(f"critic server backend 'rules': {self.path} defines no function {FUNCTION}(query, "
                              f"response) returning {{label: [span, ...]}}: add it, or use another critic.backend.")
        if not labels:
            raise CriticError("critic server backend 'rules' needs the template's labels to write its answers.")
        self.labels = tuple(labels)
        self.parameters = tuple(inspect.signature(self.function).parameters)
        self.__name__ = "rules"

    def __call__(self, messages: list[dict]) -> str:
        user = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
        blocks = {name: text for name, text in _BLOCK.findall(user if isinstance(user, str) else "")}
        missing = [p for p in self.parameters if p not in blocks]
        if missing:
            raise CriticError(f"{self.path}: {FUNCTION}() reads {missing}, but the prompt has no <{missing[0]}> "
                              f"block; found {sorted(blocks)}.")
        spans = self.function(**{p: blocks[p] for p in self.parameters})
        if not isinstance(spans, dict):
            raise CriticError(f"{self.path}: {FUNCTION}() returned {type(spans).__name__}, not {{label: [span, ...]}}.")
        return format_answer(self.labels, [(label, span) for label, items in spans.items() for span in items])
