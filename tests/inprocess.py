"""Run `drlc` and the stage scripts inside the test process, as DVC's own tests call `dvc.cli.main`.

A subprocess pays 1-3 s of Python start per call; in-process, a test of a command's behaviour (its
exit code, its one stderr line, the files it writes) costs what the command itself costs. What only
a real process shows (the interpreter's exit code, `python -m pipeline`, imports at start-up) keeps a
few `slow` tests that spawn the real thing (tests/test_bad_inputs.py, tests/test_import_time.py).

So that a call sees and leaves what a fresh process would, `_run` also, for the call only:
- captures stdout and stderr, including what goes through `warnings` (with a fresh interpreter's
  filters, not pytest's, which would record a warning instead of printing it) and `logging` (the
  root logger's handlers, pytest's among them, are set aside, so a WARNING reaches stderr as it does
  in a process without logging config; a library's handler bound to stderr writes to the capture);
- restores the working directory, sys.argv, os.environ and torch's thread count afterwards.
Still shared with the test process: modules already imported (their import-time output is not
repeated) and module-level caches.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import runpy
import sys
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# a fresh interpreter's warning filters (python -W and PYTHONWARNINGS unset), most specific first
_FRESH_FILTERS = [("default", DeprecationWarning, "__main__"), ("ignore", DeprecationWarning, None),
                  ("ignore", PendingDeprecationWarning, None), ("ignore", ImportWarning, None),
                  ("ignore", ResourceWarning, None)]


@dataclass
class Ran:
    """What a finished command left: like subprocess.CompletedProcess with capture_output and text."""
    args: list[str]
    returncode: int
    stdout: str
    stderr: str


def drlc(args: list[str], cwd: str | Path) -> Ran:
    """`drlc ARGS` (that is, `python -m pipeline ARGS`) run in `cwd`."""
    from pipeline.commands.cli import main

    return _run(["drlc", *map(str, args)], cwd, lambda: main([str(a) for a in args]))


def stage(name: str, args: list[str], cwd: str | Path) -> Ran:
    """`python stages/NAME.py ARGS` run in `cwd`, as its `if __name__ == "__main__"` block runs it."""
    script = str(ROOT / "stages" / f"{name}.py")
    return _run([script, *map(str, args)], cwd, lambda: runpy.run_path(script, run_name="__main__"))


def _run(argv: list[str], cwd: str | Path, call) -> Ran:
    out, err = io.StringIO(), io.StringIO()
    here, old_argv, old_environ, threads = os.getcwd(), sys.argv, dict(os.environ), _torch_threads()
    code = 0
    try:
        os.chdir(cwd)
        sys.argv = argv
        with _logging_to(err), _warnings_to(err), _std_streams(out, err):
            try:
                call()
            except SystemExit as done:
                code = _exit_code(done.code, err)
            except Exception:  # what the interpreter would print before exiting 1
                err.write(traceback.format_exc())
                code = 1
    finally:
        sys.argv = old_argv
        os.chdir(here)
        if dict(os.environ) != old_environ:
            os.environ.clear()
            os.environ.update(old_environ)
        if threads is not None and _torch_threads() != threads:
            import torch

            torch.set_num_threads(threads)
    return Ran(argv, code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def _std_streams(out: io.StringIO, err: io.StringIO):
    """sys.stdout and sys.stderr, and sys.__stdout__ and sys.__stderr__ (what a handler or a library may
    bind to as "the real stderr"), are the captures during the call."""
    saved = sys.__stdout__, sys.__stderr__
    sys.__stdout__, sys.__stderr__ = out, err
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield
    finally:
        sys.__stdout__, sys.__stderr__ = saved


def _torch_threads() -> int | None:
    """torch's intra-op thread count, if torch is imported (a command may set it; it is process-wide)."""
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else None


@contextlib.contextmanager
def _warnings_to(err: io.StringIO):
    """Warnings during the call are filtered as in a fresh interpreter and printed to `err`.

    catch_warnings also resets the once-per-location registries, so a warning the test process
    already showed is shown again, as a new process would show it."""
    with warnings.catch_warnings():
        warnings.resetwarnings()
        for action, category, module in reversed(_FRESH_FILTERS):
            warnings.filterwarnings(action, category=category, module=module or "")
        warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: err.write(
            warnings.formatwarning(message, category, filename, lineno, line))
        yield


@contextlib.contextmanager
def _logging_to(err: io.StringIO):
    """Log records during the call reach `err` as they would reach a fresh process's stderr.

    The root logger's handlers (pytest's capture among them) are set aside, so a record no handler
    takes goes to logging.lastResort (WARNING and above, on sys.stderr at the time: the capture).
    A handler a library bound to stderr at import (pytest's capture of it, or the real one) writes
    to `err` instead; one the call created on the capture writes, afterwards, to the stderr of the test."""
    root = logging.getLogger()
    root_handlers = root.handlers[:]
    stderr = sys.stderr
    for handler in _stream_handlers(stderr, sys.__stderr__):
        handler.setStream(err)
    root.handlers = []
    try:
        yield
    finally:
        root.handlers = root_handlers
        for handler in _stream_handlers(err):
            handler.setStream(stderr)


def _stream_handlers(*streams) -> list[logging.StreamHandler]:
    """The StreamHandlers (not file handlers) of every logger that write to one of `streams`."""
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    handlers = {id(h): h for logger in loggers for h in getattr(logger, "handlers", [])}.values()
    return [h for h in handlers if type(h) is logging.StreamHandler and any(h.stream is s for s in streams)]


def _exit_code(code, err: io.StringIO) -> int:
    """SystemExit's code as the interpreter turns it into an exit status (a message goes to stderr, status 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    err.write(f"{code}\n")
    return 1
