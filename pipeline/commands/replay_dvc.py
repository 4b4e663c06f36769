"""The DVC form of a replay: `drlc replay --dvc` writes OUT/params.yaml and OUT/dvc.yaml.

`dvc repro OUT/dvc.yaml` then runs two stages with OUT as working folder: `replay` (PPO over the
source run's recorded rollouts and cached critic answers, pipeline/commands/replay.py) and `evaluate` (the
replayed final policy, like a run's evaluate stage). Editing OUT/params.yaml re-runs only the
stages that read the changed key; a key a replay cannot change fails with the frozen-key error.
"""
from __future__ import annotations

import os
import shlex
import shutil
import tempfile
import time
from pathlib import Path

import yaml

from pipeline.commands.replay import (
    INPUT_TABLES,
    check_evaluation,
    check_frozen,
    effective_params,
    evaluate_replay,
    flat_params,
    prepare,
    raw_params,
    read_inputs,
    refuse_existing,
    resolved_evaluation,
    run_params,
    train_rounds,
    without_remote,
)
from pipeline.core import store
from pipeline.core.code_deps import CODE_ROOT, import_closure  # CODE_ROOT: the checkout the DVC form runs
from pipeline.core.config import Params, is_task_file, load_params
from pipeline.core.errors import ConfigError
from pipeline.steps.preflight import check_inputs
from pipeline.steps.stage import write_json

REPLAY_PARAMS = ["run", "world", "base", "rollout", "score", "critic", "ppo", "rounds"]  # frozen ones: compared
EVALUATE_PARAMS = ["run", "score", "evaluate"]
STAGE_SCRIPT = "stages/replay.py"  # both stages run it, so both depend on all the code it can import


def write_dvc_replay(run_dir: str | Path, out_dir: str | Path, *, overrides: list[str],
                     allow_new_calls: bool = False, progress: bool = True) -> dict:
    """Write OUT/params.yaml and OUT/dvc.yaml: the replay as DVC stages, run by `dvc repro OUT/dvc.yaml`.

    Makes the checks of `replay` first (params, tables, cached answers unless allow_new_calls,
    PPO batch shapes, evaluation inputs) and trains nothing. OUT/params.yaml holds RUN's
    params with the overrides; editing it later re-runs only the stages that read the key.
    :return: {"params": path, "dvc_yaml": path, "stages": ["replay", "evaluate"]}
    :raises: as `replay`, and ConfigError if OUT is not inside a DVC repository
    """
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    params = effective_params(run_dir, overrides)
    refuse_existing(out_dir)
    _check_inside_dvc_repo(out_dir)
    if allow_new_calls:  # the stage sends the missing requests; a full check here would send them now
        check_inputs(without_remote(params), root=run_dir)
        check_evaluation(run_dir, params, allow_new_calls=True)
        read_inputs(run_dir, params, allow_new_calls=True)
    else:
        prepare(run_dir, params, allow_new_calls=False, evaluate=True, progress=progress)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    build_dir = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.replay-"))
    try:
        (build_dir / "params.yaml").write_text(yaml.safe_dump(raw_params(params), sort_keys=False))
        stages = dvc_stages(run_dir, out_dir, params, allow_new_calls=allow_new_calls)
        (build_dir / "dvc.yaml").write_text(yaml.safe_dump(stages, sort_keys=False))
        build_dir.rename(out_dir)
    except BaseException:
        shutil.rmtree(build_dir, ignore_errors=True)
        raise
    if progress:
        print(f"wrote {out_dir / 'params.yaml'} and {out_dir / 'dvc.yaml'}; run: dvc repro {out_dir / 'dvc.yaml'}")
    return {"params": out_dir / "params.yaml", "dvc_yaml": out_dir / "dvc.yaml", "stages": list(stages["stages"])}


def _check_inside_dvc_repo(out_dir: Path) -> None:
    if not any((folder / ".dvc").is_dir() for folder in out_dir.resolve().parents):
        raise ConfigError(f"'{out_dir}' is not inside a DVC repository (no .dvc folder above it): pass an --out "
                          f"inside your project, or run `dvc init` in a folder above it.")


def dvc_stages(run_dir: Path, out_dir: Path, params: Params, *, allow_new_calls: bool) -> dict:
    """The dvc.yaml mapping of a replay folder; paths are relative to out_dir, the stages' working folder."""
    def rel(path: Path) -> str:
        return os.path.relpath(Path(path).resolve(), out_dir.resolve())

    script = shlex.quote(rel(CODE_ROOT / STAGE_SCRIPT))
    code = [rel(CODE_ROOT / path) for path in [STAGE_SCRIPT] + import_closure(STAGE_SCRIPT)]
    flags = f"--from {shlex.quote(rel(run_dir))} --params params.yaml --out ."
    flags += " --allow-new-calls" if allow_new_calls else ""
    keys, policy, data = params.round_keys(), params.evaluate.policy, run_dir / "data"
    inputs = [run_dir / "params.yaml", run_dir / "models" / "base", store.partition_dir(data, "prompts", 0)]
    inputs += [store.round_partition(data, table, int(key)) for key in keys for table in INPUT_TABLES]
    inputs += [run_dir / params.critic.template] if params.critic.enabled else []
    inputs += [CODE_ROOT / "tasks"] if is_task_file(params.run.task) else []  # a task file's folder (docs/own-task.md)
    inputs += [run_dir / "models" / f"tagger={key}" for key in params.switch]  # the critic after a switch-over
    prompt_files = [Path(p) for p in resolved_evaluation(run_dir, params)[0].prompts if p != "world"]
    per_round = [{f"metrics/{kind}/round={key}.json": {"cache": False}} for kind in ("critique", "ppo") for key in keys]
    return {"stages": {
        "replay": {
            "cmd": f"python {script} train {flags}",
            "deps": code + [rel(p) for p in inputs],
            "params": REPLAY_PARAMS,
            "outs": [f"data/{t}" for t in ("prompts", "rollouts", "scores", "annotations", "ppo_steps",
                                                      "kl_rewards")] + ["models"],
            "metrics": per_round + [{"replay.json": {"cache": False}}],
            "plots": [{"metrics/rounds.json": {"cache": False}}],
        },
        "evaluate": {
            "cmd": f"python {script} evaluate {flags}",
            "deps": code + ["data/prompts", "models/base", f"models/{policy}"]
                    + [rel(p) for p in prompt_files if p.exists()],
            "params": EVALUATE_PARAMS,
            "outs": [f"data/eval/{policy}", f"data/eval_samples/{policy}"],
            "metrics": [{"metrics/eval.json": {"cache": False}}],
        },
    }}


def replay_stage(run_dir: str | Path, out_dir: str | Path = ".", *, params_file: str | Path = "params.yaml",
                 allow_new_calls: bool = False, progress: bool = True) -> dict:
    """The `replay` stage of a DVC replay folder: train like `replay` into out_dir (data/, models/, metrics/).

    Params come from params_file; every key a replay cannot change must equal RUN's. The outputs
    are built in a temporary folder inside out_dir and moved into place only when all succeeded.
    Returns the summary also written to out_dir/replay.json. Raises: as `replay`.
    """
    started = time.perf_counter()
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    original, params = run_params(run_dir), load_params(params_file)
    check_frozen(original, params)
    prepared = prepare(run_dir, params, allow_new_calls=allow_new_calls, evaluate=False, progress=progress)
    build_dir = Path(tempfile.mkdtemp(dir=out_dir, prefix=".replay-build-"))
    try:
        summary = train_rounds(build_dir, run_dir, params, prepared, overrides=_changed(original, params), progress=progress)
        summary.update(out_dir=str(out_dir), evaluated=False, seconds=round(time.perf_counter() - started, 3))
        write_json(summary, build_dir / "replay.json")
        _move_into(build_dir, out_dir)
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)
    if progress:
        print(f"replay: {len(summary['rounds'])} rounds in {summary['seconds']:.1f}s, "
              f"{summary['critic_requests']} critic requests sent")
    return summary


def evaluate_stage(run_dir: str | Path, out_dir: str | Path = ".", *, params_file: str | Path = "params.yaml",
                   allow_new_calls: bool = False) -> dict:
    """The `evaluate` stage of a DVC replay folder: evaluate_replay with params_file's settings."""
    run_dir = Path(run_dir)
    params = load_params(params_file)
    check_frozen(run_params(run_dir), params)
    return evaluate_replay(run_dir, Path(out_dir), params, allow_new_calls=allow_new_calls)


def _changed(original: Params, params: Params) -> list[str]:
    """`key=value` for every key whose value differs from RUN's (the overrides a params file amounts to)."""
    before = flat_params(original)
    return [f"{key}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"
            for key, value in flat_params(params).items() if before[key] != value]


def _move_into(build_dir: Path, out_dir: Path) -> None:
    """Move each built output (data/<table>, models, metrics/<name>, replay.json) over out_dir's."""
    for entry in list(build_dir.iterdir()):
        for src in (list(entry.iterdir()) if entry.name in ("data", "metrics") else [entry]):
            dest = out_dir / src.relative_to(build_dir)
            if dest.is_dir():
                shutil.rmtree(dest)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dest)
