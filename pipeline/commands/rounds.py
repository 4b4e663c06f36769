"""The number of PPO rounds: the `rounds` chain and `evaluate.policy` generated from one number.

DVC templating has no arithmetic, so dvc.yaml's `foreach: ${rounds}` needs the chain written
out ("0001": {prev: base}, "0002": {prev: round=0001}, ...) and `evaluate.policy` must name the
last round. `drlc rounds N` rewrites both in params.yaml (comments and the rest of the file
kept, ruamel.yaml round-trip); `drlc rounds N --exp` prints the equivalent `dvc exp run -S`
flags, which delete and re-add the section because Hydra cannot address keys such as '0001'.

`--per-stage K` (K > 1) writes chunked rounds instead (docs/chunked-rounds.md): `rounds: {}`,
`chunks` = {first round: {prev, last}} of K rounds each (the last may be shorter), and
run.rounds_per_stage = K; K = 1 writes the per-round chain and `chunks: {}`.

`--switch-after R` writes a switch-over run instead (docs/tagger.md): `rounds: {}`, `chunks: {}` and
`switch: {R: {last: N, ...}}` (its seed and heldout_share kept); without it `switch` is set to `{}`.
"""
from __future__ import annotations

import io
import re
from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.scalarstring import DoubleQuotedScalarString

from pipeline.core.atomic import write_text
from pipeline.core.config import params_from_dict, read_yaml
from pipeline.core.errors import ConfigError

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


def chunk_chain(n_rounds: int, per_stage: int) -> dict[str, dict[str, str]]:
    """{chunk key (its first round): {prev, last}} for rounds 1..n in chunks of per_stage rounds.

    >>> list(chunk_chain(5, 2))
    ['0001', '0003', '0005']
    >>> chunk_chain(5, 2)["0005"]
    {'prev': 'round=0004', 'last': '0005'}
    """
    _check_per_stage(per_stage)
    rounds = round_chain(n_rounds)
    return {f"{first:04d}": {"prev": rounds[f"{first:04d}"], "last": f"{min(first + per_stage - 1, n_rounds):04d}"}
            for first in range(1, n_rounds + 1, per_stage)}


def _check_per_stage(per_stage: int) -> None:
    if per_stage < 1:
        raise ConfigError(f"--per-stage {per_stage}: give a whole number of rounds per stage >= 1 "
                          "(1 = per-round stages).")


def _quoted(value: str) -> str:
    return value if value == "base" else repr(value)


def _check_switch_after(n_rounds: int, per_stage: int, switch_after: int | None) -> None:
    if switch_after is not None and not 1 <= switch_after < n_rounds:
        raise ConfigError(f"--switch-after {switch_after}: give a round R in 1..{n_rounds - 1}, so that rounds "
                          f"R+1..{n_rounds} have a tagger to critique them.")
    if switch_after is not None and per_stage != 1:
        raise ConfigError(f"--switch-after with --per-stage {per_stage}: a switch-over runs each side in one stage "
                          "already; drop --per-stage.")


def exp_run_overrides(n_rounds: int, per_stage: int = 1, switch_after: int | None = None) -> list[str]:
    """`dvc exp run -S` values giving n rounds: delete `rounds` and `chunks`, re-add them whole, set
    run.rounds_per_stage and evaluate.policy; with switch_after R, `rounds: {}` and `switch` re-added too.

    >>> exp_run_overrides(2)[:2]
    ['~rounds', "+rounds={0001: {prev: base}, 0002: {prev: 'round=0001'}}"]
    >>> exp_run_overrides(2, 2)[:4]
    ['~rounds', '+rounds={}', '~chunks', "+chunks={0001: {prev: base, last: '0002'}}"]
    >>> exp_run_overrides(4, switch_after=2)[:6]
    ['~rounds', '+rounds={}', '~chunks', '+chunks={}', '~switch', "+switch={0002: {last: '0004'}}"]
    """
    _check_per_stage(per_stage)
    _check_switch_after(n_rounds, per_stage, switch_after)
    if switch_after is not None:
        return ["~rounds", "+rounds={}", "~chunks", "+chunks={}", "~switch",
                f"+switch={{{switch_after:04d}: {{last: '{n_rounds:04d}'}}}}", "run.rounds_per_stage=1",
                f"evaluate.policy='{last_policy(n_rounds)}'"]
    if per_stage == 1:
        rounds = ", ".join(f"{key}: {{prev: {_quoted(prev)}}}" for key, prev in round_chain(n_rounds).items())
        chunks = ""
    else:
        rounds = ""
        chunks = ", ".join(f"{key}: {{prev: {_quoted(c['prev'])}, last: {c['last']!r}}}"
                           for key, c in chunk_chain(n_rounds, per_stage).items())
    return ["~rounds", f"+rounds={{{rounds}}}", "~chunks", f"+chunks={{{chunks}}}",
            f"run.rounds_per_stage={per_stage}", f"evaluate.policy='{last_policy(n_rounds)}'"]


def set_rounds(params_file: str | Path, n_rounds: int, per_stage: int = 1, switch_after: int | None = None) -> None:
    """Rewrite params_file's `rounds`, `chunks`, `switch`, `run.rounds_per_stage` and `evaluate.policy` for n
    rounds (per_stage rounds per DVC stage; switch_after R: a switch-over after round R), keeping everything else.

    The new file is validated like any params file before it replaces the old one (atomically).
    Raises ConfigError for a bad number or a file that would not load afterwards.
    """
    _check_per_stage(per_stage)
    _check_switch_after(n_rounds, per_stage, switch_after)
    path = Path(params_file)
    if not path.is_file():
        raise ConfigError(f"Params file '{path}' not found: run from the project root or pass --params.")
    text = path.read_text()
    yaml = _round_trip(text)
    data = yaml.load(text)
    if not isinstance(data, dict) or not isinstance(data.get("evaluate"), dict):
        raise ConfigError(f"'{path}' has no 'evaluate' section: start from params.yaml or a profile in configs/.")
    chunked, switched = per_stage > 1, switch_after is not None
    rounds = {} if chunked or switched else {key: {"prev": prev} for key, prev in round_chain(n_rounds).items()}
    data["rounds"] = _flow_map(data.get("rounds"), rounds)
    data["chunks"] = _flow_map(data.get("chunks"), chunk_chain(n_rounds, per_stage) if chunked else {})
    data["switch"] = _switch_map(data.get("switch"), n_rounds, switch_after)
    if isinstance(data.get("run"), dict):
        data["run"]["rounds_per_stage"] = per_stage
    data["evaluate"]["policy"] = last_policy(n_rounds)
    buffer = io.StringIO()
    yaml.dump(data, buffer)
    params_from_dict(read_yaml(buffer.getvalue()))  # the result must load, or nothing is written
    write_text(path, buffer.getvalue())


def _switch_map(old, n_rounds: int, switch_after: int | None) -> CommentedMap:
    """The `switch` mapping: {} (off), or {R: {last: N}} with the old entry's seed and heldout_share kept."""
    if switch_after is None:
        return _flow_map(old, {})
    kept = next(iter(old.values()), {}) if isinstance(old, dict) and old else {}
    entry = {"last": f"{n_rounds:04d}", **{k: v for k, v in kept.items() if k in ("seed", "heldout_share")}}
    return _flow_map(old, {f"{switch_after:04d}": entry})


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


def _flow_map(old, entries: dict[str, dict]) -> CommentedMap:
    """A `rounds` or `chunks` mapping: the old one emptied (its comment kept) and refilled with flow-style entries."""
    mapping = old if isinstance(old, CommentedMap) else CommentedMap()
    for key in list(mapping):
        del mapping[key]
    for key, fields in entries.items():
        entry = CommentedMap({name: DoubleQuotedScalarString(v) if name == "last" else v for name, v in fields.items()})
        entry.fa.set_flow_style()
        mapping[DoubleQuotedScalarString(key)] = entry
    if entries:
        mapping.fa.set_block_style()
    else:
        mapping.fa.set_flow_style()  # `{}` on the key's line
    return mapping

