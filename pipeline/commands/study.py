"""`drlc study`: does the critic pay on my task? Arms × seeds as DVC experiments, and the report.

From the project's params.yaml (any task, task files included) every (arm, seed) is queued with
``dvc exp run --queue -n <arm>-s<seed> -S run.seed=<seed> -S <the arm's overrides>``, run with
``dvc exp run --run-all -j N`` and read back with ``dvc exp show --json`` (params, metrics/eval.json) and
``git show <rev>:metrics/...`` (the per-round curves, which are DVC plots). An experiment that has
finished under its name is collected, not run again: re-running the command resumes, and a new seed
runs only that seed. The arms are params overrides in a YAML file (configs/study/arms.yaml; copy it
and pass --arms-file). ``score.scale: matched`` (sparse_scaled) and ``ppo.init_kl_coef: matched``
(sparse_lowkl) are a second phase: k is computed from the finished sparse and dense experiments of the
same seeds. Everything the second phase needs is checked before the first starts (:func:`preflight`).
Queued experiments share the workspace's critic cache (pipeline/core/cache.py ``shared_directory``).
The report: pipeline/studies/study_report.py. Docs: docs/study.md.
"""
from __future__ import annotations

import functools
import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

from pipeline.core.cache import link_outside
from pipeline.core.errors import ConfigError, DataError

ARMS_FILE = Path(__file__).resolve().parents[2] / "configs" / "study" / "arms.yaml"
MATCHED = "matched"  # filled in the second phase, from the finished sparse and dense arms (matched_settings)
MATCHED_KEYS = ("score.scale", "ppo.init_kl_coef")  # k, and the project's KL coefficient / k
DEFAULT_ARMS = ("sparse", "dense", "summed", "random", "sparse_scaled")
# DVC commits each experiment (to refs/exps, never to a branch); where git has no identity, it signs them as:
IDENTITY = {"GIT_AUTHOR_NAME": "drlc study", "GIT_AUTHOR_EMAIL": "drlc-study@localhost",
            "GIT_COMMITTER_NAME": "drlc study", "GIT_COMMITTER_EMAIL": "drlc-study@localhost"}


def load_arms(path: str | Path = ARMS_FILE) -> dict[str, dict]:
    """{arm: {dotted params key: value}} from an arms file; ConfigError naming a bad entry."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"arms file {str(path)!r} not found: pass --arms-file FILE (start from {ARMS_FILE})")
    arms = yaml.safe_load(path.read_text()) or {}
    for name, settings in arms.items() if isinstance(arms, dict) else [(None, None)]:
        if not isinstance(settings, dict) or not all(isinstance(k, str) and "." in k for k in settings):
            raise ConfigError(f"{path}: arm {name!r} must map dotted params keys to values "
                              "(e.g. critic.enabled: false)")
    return arms


def pick_arms(arms: dict[str, dict], names: list[str]) -> dict[str, dict]:
    """The named arms, in the given order; ConfigError for an unknown one or a matched scale without both refs."""
    unknown = [n for n in names if n not in arms]
    if unknown:
        raise ConfigError(f"unknown arm(s) {unknown}; the arms file has {list(arms)} (add yours to a copy of it)")
    picked = {n: arms[n] for n in names}
    if any(is_matched(s) for s in picked.values()) and not {"sparse", "dense"} <= set(picked):
        matched = [n for n, s in picked.items() if is_matched(s)]
        raise ConfigError(f"{matched} match k from the sparse and dense arms: put sparse and dense in --arms too")
    return picked


def is_matched(settings: dict) -> bool:
    """Whether an arm has a value of the second phase (``matched``, filled by :func:`matched_settings`)."""
    return any(settings.get(key) == MATCHED for key in MATCHED_KEYS)


def matched_settings(settings: dict, k, kl_coef: float) -> dict:
    """An arm's settings with its matched values filled: ``score.scale`` = k (sparse_scaled, dense_scaled), and
    ``ppo.init_kl_coef`` = kl_coef / k (sparse_lowkl), where kl_coef is the project's coefficient × its score.scale
    (:func:`preflight`): k is a score.scale, so k / the project's scale is how many times larger the scaled reward
    is, and sparse_lowkl divides the project's β by that. The adaptive controller multiplies β by a factor of the
    KL alone (pipeline.train.ppo.AdaptiveKLController), so dividing its start divides its whole path. k may be the
    dry run's placeholder string."""
    filled = dict(settings)
    if filled.get("score.scale") == MATCHED:
        filled["score.scale"] = k
    if filled.get("ppo.init_kl_coef") == MATCHED:
        filled["ppo.init_kl_coef"] = f"<{kl_coef:g}/k>" if isinstance(k, str) else kl_coef / k
    return filled


def exp_name(arm: str, seed: int) -> str:
    return f"{arm}-s{seed}"


def hydra_value(value) -> str:
    """A params value in Hydra's override grammar (what `dvc exp run -S` parses): JSON, except that a
    mapping's keys are bare (Hydra rejects quoted keys)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {hydra_value(item)}" for key, item in value.items()) + "}"
    return json.dumps(value)


def set_prefix(value) -> str:
    """'++' for a mapping with keys: Hydra's struct mode cannot add a key with a plain override."""
    return "++" if isinstance(value, dict) and value else ""


def overrides(seed: int, settings: dict, extra: list[str]) -> list[str]:
    """The -S values of one experiment: its seed, its arm's settings, then extra (e.g. the rounds)."""
    return ([f"run.seed={seed}"] + [f"{set_prefix(v)}{k}={hydra_value(v)}" for k, v in settings.items()]
            + list(extra))


def queue_command(arm: str, seed: int, settings: dict, extra: list[str]) -> list[str]:
    """`dvc exp run --queue -n <arm>-s<seed> -S ...` of one experiment."""
    return ["dvc", "exp", "run", "--queue", "-n", exp_name(arm, seed),
            *[part for s in overrides(seed, settings, extra) for part in ("-S", s)]]


@functools.cache
def git_identity(project: Path) -> dict[str, str]:
    """The environment DVC's experiment commits need in `project`: {} when git has an identity there (user.name and
    user.email in any git config, or the GIT_AUTHOR_*/GIT_COMMITTER_* variables), else :data:`IDENTITY`. DVC signs
    experiments with git's identity (scmrepo reads these variables), and only these commits: a user with none
    is never blocked an hour into a grid, and their git config is never written."""
    def has(key: str, variable: str) -> bool:
        found = subprocess.run(["git", "config", "--get", key], cwd=project, capture_output=True, text=True)
        return bool(os.environ.get(variable) or found.stdout.strip())
    named = all(has(key, f"GIT_{who}_{part}") for who in ("AUTHOR", "COMMITTER")
                for key, part in (("user.name", "NAME"), ("user.email", "EMAIL")))
    return {} if named else dict(IDENTITY)


def dvc_env(project: Path) -> dict[str, str]:
    return {**os.environ, **git_identity(project)}


def dvc(project: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run `python -m dvc ARGS` in project (this interpreter's DVC); DataError with its stderr on failure."""
    result = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=project, capture_output=True, text=True,
                            env=dvc_env(project))
    if check and result.returncode != 0:
        raise DataError(f"`dvc {' '.join(args)[:200]}` failed in {project} ({result.returncode}): "
                        f"{result.stderr.strip()[-1500:]}")
    return result


def finished_experiments(shown: list[dict]) -> dict[str, dict]:
    """{name: {"rev", "params", "metrics"}} of `dvc exp show --json`'s experiments that have a commit (done).

    Queued and failed (or killed) experiments are listed too, under the 40-hex rev of their queue entry: a failed
    one carries an `error`, a queued one no metrics; neither is done."""
    found = {}
    for commit in shown:
        for exp in commit.get("experiments") or []:
            rev = (exp.get("revs") or [{}])[0]
            data = rev.get("data") or {}
            wrote_metrics = any((m or {}).get("data") for m in (data.get("metrics") or {}).values())
            if exp.get("name") and len(data.get("rev") or "") == 40 and not rev.get("error") and wrote_metrics:
                found[exp["name"]] = {
                    "rev": data["rev"], "params": data["params"]["params.yaml"]["data"],
                    "metrics": {path: m.get("data", {}) for path, m in (data.get("metrics") or {}).items()}}
    return found


def existing(project: Path) -> dict[str, dict]:
    return finished_experiments(json.loads(dvc(project, "exp", "show", "--json").stdout or "[]"))


def run_queued(project: Path, commands: list[list[str]], *, jobs: int, dry_run: bool) -> None:
    """Queue the commands and run them with `jobs` workers; DataError naming the experiments that failed.

    DVC's queue workers stop by themselves once the queue is empty, so drlc never sends `dvc queue stop`:
    a stop that arrives after its worker has gone waits in DVC's broker, and the next worker takes it
    and exits after one experiment, leaving `dvc exp run --run-all` waiting for the rest forever. Such a
    leftover (from an older drlc, or a stop typed by hand) is survived: run-all is started again while
    experiments stay queued with no worker process alive."""
    for cmd in commands:
        print("$", shlex.join(cmd), flush=True)
        if not dry_run:
            dvc(project, *cmd[1:])
    if not commands:
        return
    print(f"$ dvc exp run --run-all -j {jobs}", flush=True)
    if dry_run:
        return
    waiting, before = entries(queue_status(project), "Queued"), len(commands) + 1
    while waiting and len(waiting) < before:  # each pass runs at least one experiment, or the loop ends
        run_all(project, jobs)
        waiting, before = entries(queue_status(project), "Queued"), len(waiting)
    lost = entries(queue_status(project), "Running") if not worker_alive(project) else []
    if waiting or lost:
        raise DataError(f"experiments {waiting + lost} were left queued or running with no DVC queue worker alive; "
                        f"see `dvc queue status` in {project} and run the same command again (finished ones are kept)")
    failed = entries(queue_status(project), "Failed")
    if failed:
        raise DataError(f"experiments failed: {failed}; read `dvc queue logs <name>` in {project}, fix, and run "
                        "the same command again (finished experiments are kept)")


POLL_S = 30.0  # seconds between checks on the queue while run-all runs


def run_all(project: Path, jobs: int) -> None:
    """`dvc exp run --run-all -j jobs`, its experiments' logs on this terminal, until it ends, or until two checks in
    a row find experiments queued or running and no worker process alive (then it would wait forever)."""
    import time

    run = subprocess.Popen([sys.executable, "-m", "dvc", "exp", "run", "--run-all", "-j", str(jobs)], cwd=project,
                           env=dvc_env(project))
    gone = 0
    try:
        while run.poll() is None and gone < 2:
            time.sleep(POLL_S)
            gone = gone + 1 if stranded(queue_status(project), worker_alive(project)) else 0
        if gone >= 2:
            print("drlc study: the DVC queue worker is gone with experiments still queued; starting it again",
                  flush=True)
    finally:
        if run.poll() is None:
            run.terminate()
            run.wait()


def worker_alive(project: Path) -> bool:
    """Whether a DVC queue worker process of `project` is running, from the files DVC keeps for each
    (.dvc/tmp/exps/celery/dvc-exp-worker-N.json: its pid, and its returncode once it has exited); `dvc queue
    status` is no help here, as its count comes from asking the workers, which a busy machine leaves unanswered."""
    import os

    for info in (project / ".dvc" / "tmp" / "exps" / "celery").glob("dvc-exp-worker-*.json"):
        try:
            worker = json.loads(info.read_text())
            if worker.get("returncode") is None and worker.get("pid"):
                os.kill(int(worker["pid"]), 0)
                return True
        except (OSError, ValueError):
            continue
    return False


def queue_status(project: Path) -> str:
    return dvc(project, "queue", "status", check=False).stdout


def entries(queue_status: str, status: str) -> list[str]:
    """Names of the `dvc queue status` entries whose status is `status` (Queued, Running, Failed, Success).

    >>> entries("Task  Name  Created  Status\\na1  dense-s1  03:51 PM  Queued\\nb2  sparse-s1  03:50 PM  Failed", "Queued")
    ['dense-s1']
    """
    return [row[1] for row in (line.split() for line in queue_status.splitlines()) if len(row) >= 3 and row[-1] == status]


def stranded(queue_status: str, alive: bool) -> bool:
    """Experiments are queued or marked running, and no worker process is alive to run them.

    >>> stranded("a1  dense-s1  03:51 PM  Queued\\n\\nWorker status: 0 active, 0 idle", alive=False)
    True
    >>> stranded("a1  dense-s1  03:51 PM  Queued", alive=True), stranded("b2  sparse-s1  03:50 PM  Success", alive=False)
    (False, False)
    """
    return bool(entries(queue_status, "Queued") or entries(queue_status, "Running")) and not alive


def stale_running(queue_status: str, alive: bool) -> list[str]:
    """The experiments `dvc queue status` calls Running while no worker process is alive (`alive`: worker_alive):
    what a killed run (a session that ended, a kill) leaves. `dvc exp show` fails on them, looking for their run files."""
    return [] if alive else entries(queue_status, "Running")


def kill_stale_running(project: Path) -> None:
    """Kill the Running entries an interrupted run left with no worker alive: `dvc exp show` fails on them."""
    for name in stale_running(queue_status(project), worker_alive(project)):
        dvc(project, "queue", "kill", name, check=False)


def clear_interrupted(project: Path) -> None:
    """Kill the stale Running entries an interrupted run left, then remove the queued and failed ones, so they run
    again; finished experiments are untouched."""
    kill_stale_running(project)
    dvc(project, "queue", "remove", "--queued", "--failed", check=False)


def run_phase(project: Path, todo: list[tuple[str, int]], settings_of, extra: list[str], *, jobs: int,
              dry_run: bool) -> int:
    """Queue and run every (arm, seed) of todo not finished yet; returns how many ran."""
    if not dry_run:
        clear_interrupted(project)
    done = {} if dry_run else existing(project)
    if not dry_run:
        link_outside(project)
    new = [(arm, seed) for arm, seed in todo if exp_name(arm, seed) not in done]
    run_queued(project, [queue_command(arm, seed, settings_of(arm, seed), extra) for arm, seed in new],
               jobs=jobs, dry_run=dry_run)
    return len(new)


def mismatch(params: dict, settings: dict, seed: int, rounds: int | None, sets: list[str] = ()) -> str | None:
    """The first of an arm's settings (its seed, its number of rounds, the grid's -S overrides) a finished
    experiment's params lack, as "key=value (experiment: value)"; None when it has them all. A matched value is not
    compared. So a grid at another -S (say rollout.max_new_tokens) never collects another grid's experiments."""
    def value(key):
        node = params
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node
    wanted = {"run.seed": seed, **{k: v for k, v in settings.items() if v != MATCHED}}
    for assignment in sets:
        key, _, text = assignment.lstrip("+").partition("=")
        wanted[key] = yaml.safe_load(text)
    if rounds is not None:
        wanted["evaluate.policy"] = f"round={rounds:04d}"
    return next((f"{k}={v!r} (experiment: {value(k)!r})" for k, v in wanted.items() if value(k) != v), None)


def collect(project: Path, todo: list[tuple[str, int]], arms: dict[str, dict] | None = None,
            rounds: int | None = None, with_spread: bool = False,
            done: dict[str, dict] | None = None, sets: list[str] = ()) -> dict[str, list[dict]]:
    """{arm: [run record per seed]} of the finished experiments of todo; DataError naming any missing, or any
    whose params are not its arm's (arms given: an experiment of that name run with other settings or -S sets).
    with_spread: the records carry each round's reward spread (a scale matched by std).
    done: :func:`existing` of the project, when the caller has just read it."""
    from pipeline.studies.study_report import run_record

    done = existing(project) if done is None else done
    missing = [exp_name(a, s) for a, s in todo if exp_name(a, s) not in done]
    if missing:
        raise DataError(f"experiments {missing} are missing in {project}: see `dvc queue status`, then run the "
                        "same command again")
    for arm, seed in todo if arms else ():
        wrong = mismatch(done[exp_name(arm, seed)]["params"], arms[arm], seed, rounds, sets)
        if wrong:
            raise DataError(f"experiment {exp_name(arm, seed)} was run with other settings than arm {arm!r} has "
                            f"now: {wrong}; remove it (`dvc exp remove {exp_name(arm, seed)}`) to run it again")
    by_arm: dict[str, list[dict]] = {}
    for arm, seed in todo:
        by_arm.setdefault(arm, []).append(run_record(project, done[exp_name(arm, seed)], arm, seed, with_spread))
    return by_arm


def study(project: Path, *, arms: dict[str, dict], seeds: list[int], jobs: int = 1, rounds: int | None = None,
          out: Path | None = None, dry_run: bool = False, metric: str | None = None,
          sets: list[str] = (), report_only: bool = False, scale_match: str = "auto") -> dict | None:
    """Run (or resume) the grid and write the report into out (report.json, report.md, curves.png).

    sets: more `-S` overrides for every experiment (after the arm's; e.g. evaluate.n_prompts=16).
    scale_match: how sparse_scaled's k is matched to dense ("mean" or "std": study_report.matched_scale; "auto":
    mean where it can match, else std, study_report.match_method); the report names the one used.
    report_only: run nothing and leave DVC's queue alone (a grid may be running; only a Running entry that no
    worker runs, which `dvc exp show` fails on, is killed): report the grid's finished experiments, name the others.

    Returns the report, or None for a dry run (which prints the dvc commands only)."""
    from pipeline.commands.rounds import exp_run_overrides
    from pipeline.studies.study_report import build_report, frontier_rows, markdown, match_method, plot_curves

    project = project.resolve()
    extra = ([] if rounds is None else exp_run_overrides(rounds)) + list(sets)
    first = [(a, s) for a in arms for s in seeds if not is_matched(arms[a])]
    second = [(a, s) for a in arms for s in seeds if is_matched(arms[a])]
    kl_coef = preflight(project, arms, sets, report_only=report_only)
    if report_only:
        kill_stale_running(project)  # only entries no worker runs: a live grid is left alone
        ran = 0
    else:
        ran = run_grid(project, arms, first, second, extra, jobs=jobs, seeds=seeds, rounds=rounds,
                       dry_run=dry_run, scale_match=scale_match, kl_coef=kl_coef, sets=sets)
    if dry_run:
        return None
    done = existing(project)
    missing = [exp_name(a, s) for a, s in first + second if exp_name(a, s) not in done]
    if report_only:  # report what has finished; after a run, collect names any missing experiment as an error
        first, second = ([(a, s) for a, s in todo if exp_name(a, s) not in missing] for todo in (first, second))
    if not first + second:
        raise DataError(f"no experiment of this grid has finished in {project}: run `drlc study` without "
                        "--report-only first")
    k = scale_run_with(done, second, arms, kl_coef)  # the k the matched experiments ran with; one k, or an error
    by_arm = collect(project, first + second, arms, rounds, done=done, sets=sets)
    method = match_method(by_arm["dense"], by_arm["sparse"], scale_match) \
        if {"dense", "sparse"} <= set(by_arm) else scale_match
    report = build_report(by_arm, metric=metric, k=k, settings=arms) | {
        "project": str(project), "seeds": seeds, "rounds": rounds, "experiments_run": ran, "missing": missing,
        "scale_match": method}
    out = (out or project / "study").resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    text = markdown(report, f"drlc study: {', '.join(arms)} × seeds {seeds}")
    (out / "report.md").write_text(text)
    plot_curves(by_arm, report["metric"], out / "curves.png", report)
    (out / "frontier.json").write_text(json.dumps({"points": frontier_rows(by_arm, report["metric"])}, indent=1) + "\n")
    print(text + f"\nran {ran} experiment(s); report in {out}/report.md, report.json, curves.png, frontier.json",
          flush=True)
    return report


def preflight(project: Path, arms: dict[str, dict], sets: list[str], *, report_only: bool = False) -> float:
    """Check, before the first phase starts, everything the second needs; returns the project's
    ppo.init_kl_coef × score.scale (sparse_lowkl's coefficient is that / k, :func:`matched_settings`). One-line ConfigError or DataError naming the fix for: a
    project that is no git repo with a commit (DVC experiments start from one), an arm whose settings (its
    matched values filled with stand-ins) the project's params.yaml refuses, and sparse_lowkl on a project whose
    KL coefficient is 0. Git's identity is not needed: :func:`git_identity` supplies one, said here."""
    from pipeline.core.config import load_params

    head = subprocess.run(["git", "rev-parse", "--verify", "HEAD"], cwd=project, capture_output=True, text=True)
    if head.returncode != 0:
        raise DataError(f"{project} is not a git repository with a commit, which DVC experiments start from: run "
                        "`git init && git add -A && git commit -m project` there (dvc init too, if new)")
    base = [s.lstrip("+") for s in sets]
    for name, settings in arms.items():
        filled = matched_settings(settings, 2.0, 1.0)
        try:
            load_params(project / "params.yaml", base + [f"{k}={hydra_value(v)}" for k, v in filled.items()])
        except ConfigError as error:
            raise ConfigError(f"arm {name!r} on {project / 'params.yaml'}: {error}") from None
    params = load_params(project / "params.yaml", base)
    kl_coef = params.ppo.init_kl_coef
    if kl_coef <= 0 and any(s.get("ppo.init_kl_coef") == MATCHED for s in arms.values()):
        raise ConfigError(f"ppo.init_kl_coef = {kl_coef} in {project / 'params.yaml'}: sparse_lowkl divides it by "
                          "k, so it would run the sparse arm again; drop sparse_lowkl or set a coefficient")
    if git_identity(project) and not report_only:
        print("drlc study: git has no user.name/user.email here, so DVC's experiment commits (refs/exps, never your "
              f"branches) are signed '{IDENTITY['GIT_AUTHOR_NAME']} <{IDENTITY['GIT_AUTHOR_EMAIL']}>'", flush=True)
    return kl_coef * params.score.scale


def run_grid(project: Path, arms: dict[str, dict], first: list[tuple[str, int]], second: list[tuple[str, int]],
             extra: list[str], *, jobs: int, seeds: list[int], rounds: int | None, dry_run: bool,
             scale_match: str = "auto", kl_coef: float = 0.0, sets: list[str] = ()) -> int:
    """Run the first phase, then the matched arms (matched_settings) with k from the finished sparse and dense
    arms, or, once a matched experiment has finished, with the k it ran with; returns how many experiments ran."""
    from pipeline.studies.study_report import choose_scale

    ran = run_phase(project, first, lambda a, s: arms[a], extra, jobs=jobs, dry_run=dry_run)
    if not second:
        return ran
    done = {} if dry_run else existing(project)
    kept = scale_run_with(done, [(a, s) for a, s in second if exp_name(a, s) in done], arms, kl_coef)
    if dry_run:
        k = "<k>"
    elif kept is not None:  # seeds added to a grid are matched with the k its matched experiments ran with
        k = kept
        print(f"score.scale k = {k:.4f}, kept from the matched experiments that already ran, so every seed is "
              "matched alike (to match again, remove them: `dvc exp remove <name>`)", flush=True)
    else:
        todo = [(a, s) for a in ("sparse", "dense") for s in seeds]
        k, method = choose_scale(lambda spread: collect(project, todo, arms, rounds, spread, done, sets), scale_match)
        why = " (auto: dense's or sparse's mean reward is not positive, so no k matches the mean)" \
            if scale_match == "auto" and method == "std" else ""
        print(f"score.scale matched by {method}{why}: k = {k:.4f}", flush=True)
    matched = {a: matched_settings(arms[a], k, kl_coef) for a, _ in second}
    return ran + run_phase(project, second, lambda a, s: matched[a], extra, jobs=jobs, dry_run=dry_run)


def scale_run_with(done: dict[str, dict], matched: list[tuple[str, int]], arms: dict[str, dict] | None = None,
                   kl_coef: float = 0.0) -> float | None:
    """The k the finished matched experiments ran with (None when none has finished): score.scale of a scaled
    arm; for sparse_lowkl, kl_coef (the project's ppo.init_kl_coef × score.scale) / the experiment's
    ppo.init_kl_coef. DataError when they disagree."""
    ks = {}
    for a, s in matched:
        params = done[exp_name(a, s)]["params"]
        if (arms or {}).get(a, {"score.scale": MATCHED}).get("score.scale") == MATCHED:
            ks[exp_name(a, s)] = float(params["score"]["scale"])
        else:
            ks[exp_name(a, s)] = kl_coef / float(params["ppo"]["init_kl_coef"])
    first = next(iter(ks.values()), None)
    odd = {name: k for name, k in ks.items() if not math.isclose(k, first, rel_tol=1e-9)}
    if odd:
        raise DataError(f"the matched experiments ran with different k: {ks}; remove the odd ones "
                        "(`dvc exp remove <name>`) and run again")
    return first


def cmd_study(args) -> None:
    arms = pick_arms(load_arms(args.arms_file), args.arms)
    if args.jobs < 1:
        raise ConfigError(f"-j {args.jobs}: give at least 1 worker")
    study(Path(args.project), arms=arms, seeds=args.seeds, jobs=args.jobs, rounds=args.rounds, out=args.out,
          dry_run=args.dry_run, metric=args.metric, sets=args.set, report_only=args.report_only,
          scale_match=args.scale_match)


def add_study_parser(sub) -> None:
    parser = sub.add_parser("study", help="does the critic pay? arms x seeds as DVC experiments, and the report")
    parser.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS),
                        help=f"arms of the arms file, in run order (default: {' '.join(DEFAULT_ARMS)})")
    parser.add_argument("--arms-file", default=str(ARMS_FILE), help="YAML of {arm: {params key: value}}")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("-j", "--jobs", type=int, default=1, help="experiments run at once (dvc queue workers)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per experiment (default: params.yaml's)")
    parser.add_argument("-S", "--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a params override for every experiment, as `dvc exp run -S` takes it (repeatable)")
    parser.add_argument("--metric", default=None, help="the eval metric of the headline, e.g. world/coverage "
                        "(default: the task's first own metric by name)")
    parser.add_argument("--out", type=Path, default=None, help="report folder (default: <project>/study)")
    parser.add_argument("--project", default=".", help="the drlc project (a git repo with a commit)")
    parser.add_argument("--dry-run", action="store_true", help="print the dvc commands only")
    parser.add_argument("--scale-match", choices=("auto", "mean", "std"), default="auto",
                        help="sparse_scaled's k matches dense's mean total reward (mean), or its spread between "
                             "responses (std: for a critic that mostly subtracts reward); auto (default): mean "
                             "where both arms' mean reward is positive, else std")
    parser.add_argument("--report-only", action="store_true",
                        help="run nothing, leave the queue alone: report the finished experiments of the grid")
    parser.set_defaults(func=cmd_study)
