"""Plumbing shared by the stage scripts in stages/: arguments, params loading and checks, metrics files.

A stage script is `run(main)` around a `main()` that parses its paths, calls one function of
pipeline.steps and writes the result; any DrlcError ends it with one stderr line and exit 2.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from pipeline.core.atomic import write_text
from pipeline.core.config import Params, load_params
from pipeline.core.errors import exit_on_error


def parser(description: str, *paths: str, with_round: bool = False) -> argparse.ArgumentParser:
    """An argument parser with --params, optionally --round, and one required flag per path."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    if with_round:
        p.add_argument("--round", required=True, help="round key from params.yaml, e.g. 0001")
    for name in paths:
        p.add_argument(f"--{name}", required=True)
    return p


def start(args: argparse.Namespace, *checks) -> Params:
    """Load and validate params, then run each `check(params)` the stage needs, before any compute.

    The checks are the stage's own (e.g. pipeline.tasks.check_params, pipeline.steps.preflight.check_critic),
    passed in by the stage script, so a stage imports no check of code it never runs.
    """
    params = load_params(args.params)
    for check in checks:
        check(params)
    if getattr(args, "round", None) is not None and args.round not in params.rounds:
        from pipeline.core.errors import ConfigError

        raise ConfigError(f"--round {args.round!r} is not in params 'rounds': {params.round_keys()}.")
    return params


def write_json(data: dict, path: str | Path) -> None:
    """Write a metrics JSON file atomically (sorted keys, so re-runs give identical bytes)."""
    write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


run = exit_on_error
