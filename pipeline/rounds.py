"""The number of PPO rounds: the `rounds` chain and `evaluate.policy` generated from one number.

DVC templating has no arithmetic, so dvc.yaml's `foreach: ${rounds}` needs the chain written
out ("0001": {prev: base}, "0002": {prev: round=0001}, ...) and `evaluate.policy` must name the
last round. `drlc rounds N` rewrites both in params.yaml (comments and the rest of the file
kept, ruamel.yaml round-trip); `drlc rounds N --exp` prints the equivalent `dvc exp run -S`
flags, which delete and re-add the section because Hydra cannot address keys such as '0001'.
"""
from __future__ import annotations

import io
import os
import re
import tempfile
from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.scalarstring import DoubleQuotedScalarString

from pipeline.config import params_from_dict, read_yaml
from pipeline.errors import ConfigError

MAX_ROUNDS = 9999  # round keys have four digits


def round_chain(n_rounds: int) -> dict[str, str]:
    """{round key: prev} for rounds 1..n: round 1 starts from base, round r from round r-1.

    >>> round_chain(3)
    {'0001': 'base', '0002': 'round=0001', '0003': 'round=0002'}
    """
    if not 1 <= n_rounds <= MAX_ROUNDS:
        raise ConfigError(f"{n_rounds} rounds: give a number of rounds from 1 to {MAX_ROUNDS}.")
    return {f"{r:04d}": "base" if r == 1 else f"round={r - 1:04d}" for r in range(1, n_rounds + 1)}


def last_policy(n_rounds: int) -> str:
    """The policy evaluate.policy must name: the last round's."""
    return f"round={n_rounds:04d}"


def exp_run_overrides(n_rounds: int) -> list[str]:
    """`dvc exp run -S` values giving n rounds: delete `rounds`, re-add it whole, set evaluate.policy.

    >>> exp_run_overrides(2)
    ['~rounds', "+rounds={0001: {prev: base}, 0002: {prev: 'round=0001'}}", "evaluate.policy='round=0002'"]
    """
    items = ", ".join(f"{key}: {{prev: {prev if prev == 'base' else repr(prev)}}}"
                      for key, prev in round_chain(n_rounds).items())
    return ["~rounds", f"+rounds={{{items}}}", f"evaluate.policy='{last_policy(n_rounds)}'"]


def set_rounds(params_file: str | Path, n_rounds: int) -> None:
    """Rewrite params_file's `rounds` and `evaluate.policy` for n rounds, keeping everything else.

    The new file is validated like any params file before it replaces the old one (atomically).
    Raises ConfigError for a bad number or a file that would not load afterwards.
    """
    path = Path(params_file)
    if not path.is_file():
        raise ConfigError(f"Params file '{path}' not found: run from the project root or pass --params.")
    text = path.read_text()
    yaml = _round_trip(text)
    data = yaml.load(text)
    if not isinstance(data, dict) or not isinstance(data.get("evaluate"), dict):
        raise ConfigError(f"'{path}' has no 'evaluate' section: start from params.yaml or a profile in configs/.")
    data["rounds"] = _rounds_map(data.get("rounds"), round_chain(n_rounds))
    data["evaluate"]["policy"] = last_policy(n_rounds)
    buffer = io.StringIO()
    yaml.dump(data, buffer)
    params_from_dict(read_yaml(buffer.getvalue()))  # the result must load, or nothing is written
    _write_atomically(path, buffer.getvalue())


def _round_trip(text: str) -> YAML:
    """A round-trip YAML (comments, key order, quoting and number spelling kept) in the file's list indentation."""
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096  # never re-wrap long lines
    if re.search(r"^( *)[^\s#-][^\n]*:[ \t]*\n\1- ", text, flags=re.M):  # "key:\n- item": dash under the key
        yaml.indent(mapping=2, sequence=2, offset=0)
    else:  # "key:\n  - item"
        yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.representer.add_representer(type(None), _represent_null)
    return yaml


def _represent_null(representer, _value):
    """Write None as `null`, as params.yaml spells it (ruamel's default is an empty value)."""
    return representer.represent_scalar("tag:yaml.org,2002:null", "null")


def _rounds_map(old, chain: dict[str, str]) -> CommentedMap:
    """The `rounds` mapping: the old one emptied (its comment kept) and refilled with flow-style entries."""
    rounds = old if isinstance(old, CommentedMap) else CommentedMap()
    for key in list(rounds):
        del rounds[key]
    for key, prev in chain.items():
        entry = CommentedMap(prev=prev)
        entry.fa.set_flow_style()
        rounds[DoubleQuotedScalarString(key)] = entry
    return rounds


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
