"""An OpenAI-compatible critic server run as a child process on a free loopback port (llama.cpp's, vLLM's).

:func:`serve_process` starts the command, waits until ``GET /v1/models`` answers, yields the base URL
for a ``with`` block, and stops the process after it. A server that exits or stays silent raises
CriticError whose message ends with the tail of the server's own log.

The server starts in its own process group (session), and :func:`stop` signals the whole group: vLLM's server
runs its engine in a child process that holds the GPU memory, and a signal to the direct child alone can leave it
running.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from pipeline.core.errors import CriticError

__all__ = ["free_port", "serve_process", "stop"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def serve_process(command: Callable[[int], list[str]], *, name: str, timeout_s: float,
                  poll_s: float = 0.5) -> Iterator[str]:
    """Run ``command(port)`` on a free port for a ``with`` block; yield ``http://127.0.0.1:<port>/v1``.

    name: the server's name in errors ("vLLM's server"). Raises CriticError when the process exits, or does
    not answer ``/v1/models`` within ``timeout_s``.
    """
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    with tempfile.TemporaryFile("w+") as log:
        server = subprocess.Popen(command(port), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            _wait_until_up(url, server, log, name=name, timeout_s=timeout_s, poll_s=poll_s)
            yield url
        finally:
            stop(server)


def stop(server: subprocess.Popen, timeout_s: float = 30) -> None:
    """Terminate `server`'s process group (it leads one: started with start_new_session), and kill the group if
    the server has not exited within `timeout_s`; what is left of the group after the server exits is killed too."""
    _signal_group(server, signal.SIGTERM)
    try:
        server.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _signal_group(server, signal.SIGKILL)
        server.wait()
    _signal_group(server, signal.SIGKILL)  # children that outlived their parent (nothing when none is left)


def _signal_group(server: subprocess.Popen, sig: int) -> None:
    """Send `sig` to the process group `server` leads; no-op once the group is gone."""
    try:
        os.killpg(server.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_until_up(url: str, server: subprocess.Popen, log, *, name: str, timeout_s: float, poll_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise CriticError(f"{name} exited with {server.returncode} before answering: {_tail(log)}")
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(poll_s)
    raise CriticError(f"{name} did not answer {url}/models within {timeout_s} s: {_tail(log)}")


def _tail(log, chars: int = 800) -> str:
    log.flush()
    log.seek(0)
    return " ".join(log.read()[-chars:].split())
