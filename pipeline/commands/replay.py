"""Zero-cost replay: train a fresh policy on the rollouts a finished run recorded, then evaluate it.

`replay(RUN, OUT, overrides=[...])` starts from RUN's models/base and runs, round by round, the
`ppo` stage's code (pipeline.steps.ppo_round) over RUN's recorded rollouts, with the stored
environment rewards and intrinsic rewards rebuilt from the cached critic answers under the new
settings; PPO ratios use the recorded behaviour log-probs. Training generates nothing and sends
no critic request unless `allow_new_calls` (then only the missing answers, stored in RUN's
cache). Unless `evaluate=False`, the final policy is then evaluated like the `evaluate` stage, so
OUT has the eval tables and metrics/eval.json of a normal run. Relative paths in the params are
resolved against RUN. Every check runs before anything is written; OUT is built in a temporary
sibling and renamed at the end. `write_dvc_replay` is the DVC form: OUT/params.yaml and
OUT/dvc.yaml whose stages (replay_stage, evaluate_stage via stages/replay.py) run with
`dvc repro`. Usage, layout and errors: docs/replay.md.
"""
from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tempfile
import time
from pathlib import Path

import yaml

from pipeline.core import store
from pipeline.core.config import Params, apply_override, load_params, params_from_dict, read_yaml
from pipeline.core.errors import ConfigError, DataError
from pipeline.steps.preflight import check_inputs
from pipeline.steps.stage import write_json

FROZEN = {  # key or section -> why a replay cannot change it (the recorded data depend on it)
    "run.task": "the recorded rollouts, scores and critic answers belong to this task",
    "world": "the prompts and the pretraining corpus were generated with it",
    "base": "models/base was pretrained with it",
    "rollout": "the recorded rollouts were sampled with it",
    "score": "the stored environment rewards were computed with it",
    "rounds": "replay trains exactly the recorded rounds",
}
INPUT_TABLES = ("rollouts", "scores")


def replay(run_dir: str | Path, out_dir: str | Path, *, overrides: list[str], allow_new_calls: bool = False,
           evaluate: bool = True, progress: bool = True) -> dict:
    """Retrain a fresh policy from RUN's models/base on RUN's recorded rounds; write the run to OUT.

    :param run_dir: a finished project folder (params.yaml, data/, models/base, critic cache)
    :param out_dir: the new run folder; must not exist yet
    :param overrides: `section.key=value` assignments applied to RUN's params (ppo.*, run.seed,
        run.run_id, critic reward values, alignment, a lower threshold, evaluate.*, ...)
    :param allow_new_calls: request the critic answers missing from the cache (e.g. for a
        raised threshold) and let a remote evaluation scorer run; otherwise no request is sent
    :param evaluate: evaluate the final policy like the `evaluate` stage (eval tables, metrics/eval.json)
    :param progress: print one line per round and show progress bars
    :return: {"critic_requests", "rounds", "seconds", "evaluate_seconds", "run_dir", "out_dir", "overrides", ...}
    :raises ConfigError: a frozen or unknown key (with the nearest valid one), a bad value, an
        existing OUT; missing critic answers or a remote evaluation scorer without allow_new_calls
    :raises DataError: RUN lacks params.yaml, models/base, a recorded table, its critic cache or
        (when evaluating) its prompts table or an evaluation prompts file
    :raises CriticError: the critic budget stopped new requests (allow_new_calls only)
    :raises PPOInputError: the recorded batches do not fit the new PPO settings
    """
    started = time.perf_counter()
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    params = effective_params(run_dir, overrides)
    refuse_existing(out_dir)
    prepared = prepare(run_dir, params, allow_new_calls=allow_new_calls, evaluate=evaluate, progress=progress)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    build_dir = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.replay-"))
    try:
        (build_dir / "params.yaml").write_text(yaml.safe_dump(raw_params(params), sort_keys=False))
        summary = train_rounds(build_dir, run_dir, params, prepared, overrides=overrides, progress=progress)
        if evaluate:
            evaluated = time.perf_counter()
            evaluate_replay(run_dir, build_dir, params, allow_new_calls=allow_new_calls)
            summary["evaluate_seconds"] = round(time.perf_counter() - evaluated, 3)
        summary.update(out_dir=str(out_dir), evaluated=evaluate, seconds=round(time.perf_counter() - started, 3))
        write_json(summary, build_dir / "replay.json")
        build_dir.rename(out_dir)
    except BaseException:
        shutil.rmtree(build_dir, ignore_errors=True)
        raise
    if progress:
        print(f"replay: {len(summary['rounds'])} rounds{' + evaluation' if evaluate else ''} in "
              f"{summary['seconds']:.1f}s, {summary['critic_requests']} critic requests sent -> {out_dir}")
    return summary


def prepare(run_dir: Path, params: Params, *, allow_new_calls: bool, evaluate: bool, progress: bool) -> dict:
    """Every check before writing; returns {"inputs", "annotations", "critique_metrics", "requests"}."""
    check_inputs(without_remote(params), root=run_dir)
    if evaluate:
        check_evaluation(run_dir, params, allow_new_calls=allow_new_calls)
    inputs = read_inputs(run_dir, params, allow_new_calls=allow_new_calls)
    annotations, critique_metrics, requests = rebuild_annotations(
        run_dir, params, inputs, allow_new_calls=allow_new_calls, progress=progress)
    _check_batches(inputs, annotations, params)
    return {"inputs": inputs, "annotations": annotations, "critique_metrics": critique_metrics,
            "requests": requests, "allow_new_calls": allow_new_calls}


def refuse_existing(out_dir: Path) -> None:
    if out_dir.exists():
        raise ConfigError(f"Replay output '{out_dir}' already exists: pass a new folder (nothing is overwritten).")


def effective_params(run_dir: Path, overrides: list[str]) -> Params:
    """RUN's params with the overrides applied; raises ConfigError for a key a replay cannot change."""
    original = run_params(run_dir)
    raw = read_yaml((run_dir / "params.yaml").read_text())
    before = flat_params(original)
    for assignment in overrides:
        apply_override(raw, assignment)
        key = assignment.split("=", 1)[0]
        _refuse_frozen(key, before.get(key), read_yaml(assignment.split("=", 1)[1]) if "=" in assignment else None)
    params = params_from_dict(raw)  # checked after the frozen keys: their errors say more
    check_frozen(original, params)
    return params


def run_params(run_dir: Path) -> Params:
    """RUN's params.yaml, loaded and validated; DataError if RUN has none."""
    params_file = Path(run_dir) / "params.yaml"
    if not params_file.is_file():
        raise DataError(f"'{run_dir}' has no params.yaml: --from must name a finished project folder.")
    return load_params(params_file)


def check_frozen(original: Params, params: Params) -> None:
    """Raise ConfigError naming the first key that differs from RUN's and that a replay cannot change."""
    before, after = flat_params(original), flat_params(params)
    for key in sorted(after):
        _refuse_frozen(key, before[key], after[key])


def _refuse_frozen(key: str, old, new) -> None:
    """Raise ConfigError if `key` is one a replay cannot change and the value changes."""
    why = FROZEN.get(key) or FROZEN.get(key.split(".")[0])
    if why and old != new:
        raise ConfigError(f"'{key}' cannot change in a replay ({old!r} -> {new!r}): {why}. "
                          f"Start a new run (dvc repro) to change it.")


def flat_params(params: Params) -> dict:
    """{"section.key": value} for every section field, plus "rounds" as one value."""
    flat = {"rounds": dataclasses.asdict(params)["rounds"]}
    for section, values in dataclasses.asdict(params).items():
        if section != "rounds":
            flat.update({f"{section}.{key}": value for key, value in values.items()})
    return flat


def without_remote(params: Params) -> Params:
    """Params for check_inputs minus its API-key check (a cache-only replay, an estimate need no key)."""
    return dataclasses.replace(params, critic=dataclasses.replace(params.critic, endpoint="local"))


def read_inputs(run_dir: Path, params: Params, *, allow_new_calls: bool = False) -> dict[str, dict[str, list[dict]]]:
    """{round key: {"rollouts": rows, "scores": rows}}; DataError lists every missing input at once."""
    needed = [run_dir / "models" / "base"] + [
        store.round_partition(run_dir / "data", table, int(key)) / "part-0.parquet"
        for key in params.round_keys() for table in INPUT_TABLES]
    if params.critic.enabled and not allow_new_calls:
        needed.append(_cache_dir(run_dir, params))
    missing = [str(path.relative_to(run_dir)) for path in needed if not path.exists()]
    if missing:
        raise DataError(f"Run folder '{run_dir}' is not a finished run: missing {missing}. "
                        f"Finish it with `dvc repro` there first.")
    inputs = {}
    for key in params.round_keys():
        tables = {t: store.read_table(store.round_partition(run_dir / "data", t, int(key)), t) for t in INPUT_TABLES}
        if not tables["rollouts"]:
            raise DataError(f"'{run_dir}/data/rollouts/round={key}' has no rows: re-run that round's rollout stage.")
        inputs[key] = tables
    return inputs


def _cache_dir(run_dir: Path, params: Params) -> Path:
    return run_dir / params.critic.cache_dir  # an absolute cache_dir stays as it is


def rebuild_annotations(run_dir: Path, params: Params, inputs: dict, *, allow_new_calls: bool,
                        progress: bool) -> tuple[dict[str, list[dict]], dict[str, dict], int]:
    """Annotations and critique metrics per round from the cached critic answers.

    Each round runs the critique stage's :func:`~pipeline.steps.critique.critique_round` (with its
    health check) on a fresh client over RUN's cache. Returns (annotations by round, critique
    metrics by round, critic requests sent in total).
    Raises ConfigError when answers are missing and allow_new_calls is off; CriticError as the stage.
    """
    from pipeline.critic.annotate import skipped_row
    from pipeline.critic.client import RunStats
    from pipeline.steps.critique import scored_rows
    from pipeline.steps.critique import summarize as critique_summary

    from pipeline.steps.switch import round_critic

    run_id = params.run.run_id
    annotations, metrics, total, opened = {}, {}, 0, {}
    with contextlib.ExitStack() as stack:
        for key, tables in inputs.items():
            rows = scored_rows(tables["rollouts"], tables["scores"])
            critic = round_critic(params, key, run_dir / "models")  # after a switch-over: the run's own tagger
            if not critic.enabled:
                rows_out, stats = [skipped_row(row) for row in rows], RunStats()
            else:
                which = (critic.backend, critic.model_dir)
                if which not in opened:
                    opened[which] = _open_critic(stack, run_dir, params, critic, allow_new_calls=allow_new_calls)
                rows_out, stats = _critique(rows, opened[which], critic, run_dir, progress=progress,
                                            budget_error=None if allow_new_calls else _missing_answers(key, params))
            total += stats.requests_sent
            annotations[key] = [dict(a, run_id=run_id, round=int(key)) for a in rows_out]
            metrics[key] = critique_summary(annotations[key], stats)
    return annotations, metrics, total


def _critique(rows: list[dict], open_critic: dict, critic, run_dir: Path, *, progress: bool, budget_error):
    """One round's critique_round on `open_critic`, as the stage runs it: a rule critic (free) is run again on the
    rows and their prompts' columns; any other critic answers from the cache (or the server, with new calls)."""
    from pipeline.steps.critique import critique_by_rules, critique_round

    shared = {"cache": open_critic["cache"], "template": open_critic["template"], "fields": open_critic["fields"],
              "tokenizer": open_critic["tokenizer"], "critic": critic, "progress": progress}
    if critic.endpoint == "local" and critic.backend == "rules":
        return critique_by_rules(rows, _prompt_rows(run_dir), **shared)
    return critique_round(rows, client=open_critic["client"](), budget_error=budget_error, **shared)


def _prompt_rows(run_dir: Path) -> list[dict]:
    """RUN's prompts table (its columns reach a rule critic); [] for a run without one."""
    prompts = store.partition_dir(run_dir / "data", "prompts", 0)
    return store.read_table(prompts, "prompts") if (prompts / "part-0.parquet").is_file() else []


def _open_critic(stack: contextlib.ExitStack, run_dir: Path, params: Params, critic, *, allow_new_calls: bool) -> dict:
    """RUN's template, tokenizer and cache, and a client factory for `critic` (cache-only unless allow_new_calls)."""
    from transformers import AutoTokenizer

    from pipeline.core.cache import CriticCache
    from pipeline.critic.templates import load_template
    from pipeline.steps.critique import critic_client, critic_endpoint
    from pipeline.tasks import get_task

    fields = get_task(params.run.task).critic_fields
    template = load_template(run_dir / critic.template, task=params.run.task, labels=critic.labels, fields=fields)
    cache = stack.enter_context(CriticCache(_cache_dir(run_dir, params)))
    base_url = stack.enter_context(critic_endpoint(critic, labels=template.labels))[0] if allow_new_calls else None
    return {"template": template, "fields": fields, "cache": cache,
            "tokenizer": AutoTokenizer.from_pretrained(str(run_dir / "models" / "base")),
            "client": lambda: critic_client(critic, base_url, template_sha=template.sha256)}


def _missing_answers(key: str, params: Params):
    """The error for a cache-only replay's budget-stopped rows: their answers are not in the cache."""
    return lambda stopped: ConfigError(
        f"Round {key}: {stopped} responses to critique have no cached critic answer under 'critic.threshold' = "
        f"{params.critic.threshold} (and critic.model/template/endpoint/temperature/max_tokens as set): a "
        f"replay without new calls can only lower the threshold. Pass --allow-new-calls to request just the "
        f"missing answers.")


def _check_batches(inputs: dict, annotations: dict, params: Params) -> None:
    """Fail before writing if a recorded round does not fit the PPO settings (e.g. mini_batch_size)."""
    from pipeline.steps.ppo_round import join_round
    from pipeline.train.trainer import validate_batch

    for key, tables in inputs.items():
        validate_batch(join_round(tables["rollouts"], tables["scores"], annotations[key]), params.ppo)


def train_rounds(build_dir: Path, run_dir: Path, params: Params, prepared: dict, *, overrides: list[str],
           progress: bool) -> dict:
    """Write the copied inputs and annotations to build_dir and train every round with ppo_round.

    Returns the replay summary so far (run_dir, overrides, critic requests, rounds).
    """
    from pipeline.evaluate.curves import round_curves
    from pipeline.steps.ppo_round import ppo_round
    from pipeline.steps.ppo_round import summarize as ppo_summary

    data, models, run_id = build_dir / "data", build_dir / "models", params.run.run_id
    shutil.copytree(run_dir / "models" / "base", models / "base")
    if prompts := _prompt_rows(run_dir):
        store.write_table([dict(row, run_id=run_id) for row in prompts], "prompts", store.partition_dir(data, "prompts", 0))
    for key, tables in prepared["inputs"].items():
        round_, annotations = int(key), prepared["annotations"][key]
        for table, rows in (*tables.items(), ("annotations", annotations)):
            store.write_table([dict(row, run_id=run_id) for row in rows], table,
                              store.partition_dir(data, table, round_))
        critique_metrics = prepared["critique_metrics"][key]
        write_json(critique_metrics, build_dir / "metrics" / "critique" / f"round={key}.json")
        kl_rewards = []
        steps = ppo_round(
            tables["rollouts"], tables["scores"], annotations, policy_dir=str(models / params.rounds[key].prev),
            reference_dir=str(models / "base"), out_dir=str(models / f"round={key}"), params=params.ppo,
            run_id=run_id, round_=round_, seed=params.run.seed, base=params.base, kl_rewards=kl_rewards,
        )
        store.write_table(steps, "ppo_steps", store.partition_dir(data, "ppo_steps", round_))
        store.write_table(kl_rewards, "kl_rewards", store.partition_dir(data, "kl_rewards", round_))
        write_json(ppo_summary(steps), build_dir / "metrics" / "ppo" / f"round={key}.json")
        if progress:
            print(f"replay: round {key}: {len(steps)} PPO steps, "
                  f"{critique_metrics['critiqued']} critiqued responses")
    write_json({"rounds": round_curves(data)}, build_dir / "metrics" / "rounds.json")
    return {"run_dir": str(run_dir), "overrides": list(overrides), "allow_new_calls": prepared["allow_new_calls"],
            "critic_requests": prepared["requests"], "rounds": params.round_keys()}


def raw_params(params: Params) -> dict:
    """Params as the plain mapping params.yaml holds (load_params of it gives `params` back)."""
    raw = dataclasses.asdict(params)
    chunked = bool(params.chunks or params.switch)  # then `rounds` is empty in the file, expanded from them on load
    raw["rounds"] = {} if chunked else {key: {"prev": spec["prev"]} for key, spec in raw["rounds"].items()}
    return raw


def check_evaluation(run_dir: Path, params: Params, *, allow_new_calls: bool) -> None:
    """Fail before training if the evaluation could not run (remote scorer, no prompts, a missing file)."""
    from pipeline.evaluate.prompts import load_prompt_sets

    if params.score.scorer == "perspective" and not allow_new_calls:
        raise ConfigError("Evaluating the replayed policy would send its new samples to the Perspective API "
                          "('score.scorer' = 'perspective'): pass --allow-new-calls to allow those requests, "
                          "or --no-evaluate to train only.")
    prompts = store.partition_dir(run_dir / "data", "prompts", 0)
    if not (prompts / "part-0.parquet").is_file():
        raise DataError(f"Run folder '{run_dir}' has no data/prompts/round=0000, which the evaluation samples "
                        f"from: finish the run with `dvc repro` there, or pass --no-evaluate.")
    evaluate_params, _ = resolved_evaluation(run_dir, params)
    load_prompt_sets(evaluate_params.prompts, store.read_table(prompts, "prompts"), evaluate_params.n_prompts)


def resolved_evaluation(run_dir: Path, params: Params):
    """(evaluate, score) sections whose relative paths are resolved against RUN where they exist there."""
    e, s = params.evaluate, params.score
    e = dataclasses.replace(
        e, prompts=[p if p == "world" else _in_run(run_dir, p) for p in e.prompts],
        classifier_data=e.classifier_data if e.classifier_data == "world" else _in_run(run_dir, e.classifier_data),
        fluency_model=e.fluency_model if e.fluency_model == "base" else _in_run(run_dir, e.fluency_model),
        reward_model=_in_run(run_dir, e.reward_model))
    return e, dataclasses.replace(s, model=_in_run(run_dir, s.model), cache_dir=str(Path(run_dir) / s.cache_dir))


def _in_run(run_dir: Path, value: str | None) -> str | None:
    """RUN/value if value is a relative path that exists in RUN; else value (absolute, a hub id, None)."""
    if value is None or Path(value).is_absolute() or not (Path(run_dir) / value).exists():
        return value
    return str(Path(run_dir) / value)


def evaluate_replay(run_dir: Path, out_dir: Path, params: Params, *, allow_new_calls: bool) -> dict:
    """Evaluate out_dir's final policy against its base like the `evaluate` stage; write its outputs.

    Writes data/eval/<policy>, data/eval_samples/<policy> and metrics/eval.json under out_dir.
    Returns the metrics ({policy: {prompt set: {metric: value}}}).
    Raises: as check_evaluation; DataError for a bad classifier file (from the evaluate step).
    """
    from pipeline.steps.evaluate import evaluate

    check_evaluation(run_dir, params, allow_new_calls=allow_new_calls)
    evaluate_params, score = resolved_evaluation(run_dir, params)
    policy, data = params.evaluate.policy, Path(out_dir) / "data"
    rows, samples, metrics = evaluate(
        store.read_table(store.partition_dir(data, "prompts", 0), "prompts"),
        base_dir=str(Path(out_dir) / "models" / "base"), policy_dir=str(Path(out_dir) / "models" / policy),
        policy_name=policy, run_id=params.run.run_id, round_=int(policy.split("=")[1]), seed=params.run.seed,
        params=evaluate_params, task=params.run.task, score=score,
    )
    store.write_table(rows, "eval", data / "eval" / policy)
    store.write_table(samples, "eval_samples", data / "eval_samples" / policy)
    write_json(metrics, Path(out_dir) / "metrics" / "eval.json")
    return metrics


# --- The DVC form: OUT/dvc.yaml with the stages `replay` and `evaluate` (stages/replay.py) ---------
