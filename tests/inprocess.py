"""Run `drlc` and the stage scripts inside the test process, as DVC's own tests call `dvc.cli.main`.

A subprocess pays 1-3 s of Python start per call; in-process, a test of a command's behaviour (its
exit code, its one stderr line, the files it writes) costs what the command itself costs. What only
a real process shows (the interpreter's exit code, imports at start-up) keeps a few `slow` tests
that spawn the real thing (tests/test_bad_inputs.py, tests/test_import_time.py).
"""
from __future__ import annotations

import contextlib
import io
import os
import runpy
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
    here, old_argv = os.getcwd(), sys.argv
    code = 0
    try:
        os.chdir(cwd)
        sys.argv = argv
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
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
    return Ran(argv, code, out.getvalue(), err.getvalue())


def _exit_code(code, err: io.StringIO) -> int:
    """SystemExit's code as the interpreter turns it into an exit status (a message goes to stderr, status 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    err.write(f"{code}\n")
    return 1
