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


class RuleClient:
    """``critic.backend: rules`` in the critique stage's own process: the file's critic() called on each row.

    It stands where the HTTP client stands (``run(requests, cache)`` -> one CriticResult per request,
    ``model``, ``last_stats``), for the rows the requests were rendered from (`rows`, in the same order),
    and answers from the row itself, not from the rendered template: critic(query, response, ...)
    gets each parameter it names from the row (a scored rollout with its prompt's columns). Its answers
    are JSON spans (``critic.answer_format`` json), so a span may hold any character. Each answer is
    cached under the key the HTTP client would use (`keys`: its ``key_for``) with the values critic()
    reads added to the key's body, since a column or the env_reward need not be in the rendered
    template; a critic() that raises stops the stage with one CriticError naming the file and line.
    """

    model = "drlc-rules"

    def __init__(self, path: str | Path, *, labels: tuple[str, ...], rows: list[dict], keys) -> None:
        self.backend = RuleBackend(path, labels=labels)
        self.rows, self.keys = rows, keys
        from pipeline.critic.client import RunStats

        self.last_stats = RunStats()

    def run(self, requests: list[list[dict]], cache, *, sample_index: int = 0, progress: bool = False,
            bodies: list[dict] | None = None) -> list:
        from pipeline.critic.client import CriticResult, RunStats

        if len(requests) != len(self.rows):
            raise CriticError(f"rules critic: {len(requests)} requests for {len(self.rows)} rows (a drlc bug).")
        self.last_stats, results = RunStats(), []
        for row, messages, body in zip(self.rows, requests, bodies or [{}] * len(requests)):
            key = self.keys(messages, sample_index, {**body, "rule_inputs": self.inputs(row)})
            cached = cache.get(key)
            if isinstance(cached, dict):
                self.last_stats.cache_hits += 1
                results.append(CriticResult("ok", key, cache_hit=True, raw_text=cached["raw_text"],
                                            finish_reason="stop", model=self.model))
                continue
            text = self.answer(row)
            cache.put(key, {"raw_text": text, "finish_reason": "stop", "model": self.model, "latency_s": 0.0,
                            "usage": {"prompt_tokens": 0, "completion_tokens": 0}, "system_fingerprint": None})
            results.append(CriticResult("ok", key, raw_text=text, finish_reason="stop", model=self.model,
                                        attempts=1))
        return results

    def inputs(self, row: dict) -> dict:
        """{parameter: value} of critic() for one row; CriticError naming what the row lacks."""
        missing = [p for p in self.backend.parameters if p not in row]
        if missing:
            raise CriticError(f"{self.backend.path}: {FUNCTION}() reads {missing}, which neither the scored rollout "
                              f"nor its prompt's columns hold (they have {sorted(row)}).")
        return {p: row[p] for p in self.backend.parameters}

    def answer(self, row: dict) -> str:
        """The JSON answer {"spans": [{label, text}, ...]} of critic() on one row."""
        import json

        from pipeline.core.user_code import where

        try:
            spans = self.backend.function(**self.inputs(row))
        except Exception as error:
            raise CriticError(f"{FUNCTION}() of {self.backend.path} raised on response {row.get('rollout_id')}"
                              f"{where(error, self.backend.path)}: {type(error).__name__}: {error}") from error
        if not isinstance(spans, dict) or not all(isinstance(v, (list, tuple)) for v in spans.values()):
            raise CriticError(f"{self.backend.path}: {FUNCTION}() returned {type(spans).__name__}, not "
                              f"{{label: [span, ...]}}.")
        return json.dumps({"spans": [{"label": label, "text": str(span)} for label, items in spans.items()
                                     for span in items]}, ensure_ascii=False)
