"""The `drlc` command: checks, the DuckDB catalog, the critic cache, the local critic server and audits.

The pipeline itself runs with `dvc repro`; this command covers what sits around it.
"""
from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path

from pipeline.commands.estimate import add_estimate_parser
from pipeline.commands.study import add_study_parser
from pipeline.core.config import CRITIC_BACKENDS
from pipeline.core.errors import ConfigError, DrlcError
from pipeline.critic.offline.lexicon import LAYOUTS


def cmd_check(args) -> None:
    from pipeline.core.config import load_params
    from pipeline.commands.check import check_run_inputs

    params = load_params(args.params, args.set)
    check_run_inputs(params)
    print(f"{args.params}: ok ({len(params.rounds)} rounds, task {params.run.task}, "
          f"critic {'on' if params.critic.enabled else 'off'})")


def cmd_task_new(args) -> None:
    from pipeline.commands.task_new import write_skeleton

    for path in write_skeleton(args.name, args.root):
        print(f"wrote {path}")
    print(f"run it: cp configs/{args.name}.yaml params.yaml && dvc repro   (docs/own-task.md)")


def cmd_task_deps(args) -> None:
    from pipeline.core.config import load_params
    from pipeline.tasks._deps import write_task_deps

    deps = write_task_deps(load_params(args.params, args.set))
    files = deps["code"] + deps["templates"]
    print(f"dvc.yaml: the task stages depend on {files or 'no file of tasks/ (a built-in task)'}")


def cmd_rounds(args) -> None:
    from pipeline.commands.rounds import exp_run_overrides, set_rounds

    if args.exp:
        overrides = exp_run_overrides(args.n, args.per_stage, args.switch_after)
        print("dvc exp run " + " ".join(f"-S {_shell_word(value)}" for value in overrides))
        return
    set_rounds(args.params, args.n, args.per_stage, args.switch_after)
    n_chunks = -(-args.n // args.per_stage)
    chunks = f", {n_chunks} chunk stage{'s' * (n_chunks > 1)} of {args.per_stage}" if args.per_stage > 1 else ""
    if args.switch_after:
        chunks = (f", the critic through round {args.switch_after:04d}, then a tagger of its answers "
                  f"(switch_critic, switch_distill, switch_tagger @{args.switch_after:04d})")
    print(f"{args.params}: {args.n} rounds (0001..{args.n:04d}){chunks}, evaluate.policy = round={args.n:04d}")


def _shell_word(value: str) -> str:
    """value quoted for a POSIX shell, in double quotes when that needs no escapes (readable -S flags)."""
    return f'"{value}"' if not set(value) & set('"$`\\!') else shlex.quote(value)


EXPORTS = (".csv", ".parquet")  # drlc sql --out FILE: the result as a file, by its suffix


def query_only(sql: str) -> str:
    """sql when it is one query (SELECT, WITH, FROM, VALUES, SHOW, DESCRIBE, SUMMARIZE); else DrlcError in one line.

    `drlc sql` reads: a COPY, CREATE, INSERT, ATTACH, INSTALL, SET or a second statement is refused here,
    before DuckDB runs anything, and a result goes to a file only through --out."""
    import duckdb

    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as error:
        raise DrlcError(f"Query failed: {str(error).splitlines()[0]}") from None
    export = "to export a result, run `drlc sql --out FILE.csv \"SELECT ...\"` (or FILE.parquet)"
    if len(statements) != 1:
        raise DrlcError(f"drlc sql runs one query per call, and this holds {len(statements)} statements: "
                        f"run them one by one; {export}")
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        raise DrlcError(f"drlc sql only reads, and this is a {kind.name} statement: write a SELECT; {export}")
    return sql


def cmd_sql(args) -> None:
    import duckdb

    from pipeline.core.store import connect_skipping_broken

    if args.out and Path(args.out).suffix not in EXPORTS:
        raise ConfigError(f"--out {args.out}: name a file ending in {' or '.join(EXPORTS)}")
    query = query_only(args.query)
    con, broken = connect_skipping_broken(args.data)
    try:
        result = con.sql(query)
    except duckdb.Error as err:
        named = [message for table, message in broken.items() if re.search(rf"\b{table}\b", query)]
        raise DrlcError(named[0] if named else f"Query failed: {str(err).splitlines()[0]}") from None
    if args.out:
        export(result.fetch_arrow_table(), Path(args.out))
    else:
        print(result.df().to_string(index=False) if args.format == "table" else result.df().to_csv(index=False))


def export(table, out: Path) -> None:
    """`drlc sql --out`: the result as CSV or Parquet, written by pyarrow (the DuckDB connection writes nothing)."""
    import pyarrow.csv
    import pyarrow.parquet

    from pipeline.core.atomic import atomic_file

    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(out) as temp:
        (pyarrow.csv.write_csv if out.suffix == ".csv" else pyarrow.parquet.write_table)(table, temp)
    print(f"wrote {out} ({table.num_rows} rows)")


def cmd_catalog(args) -> None:
    from pipeline.core.store import sandbox_statements, table_folder, view_statements

    views = view_statements(args.data)
    if not views:
        raise DrlcError(f"No tables under '{args.data}': run `dvc repro` first.")
    folders = [table_folder(args.data, sql.split()[4]) for sql in views]  # CREATE OR REPLACE VIEW <table> AS ...
    Path(args.out).write_text(";\n".join(views + sandbox_statements(folders)) + ";\n")
    print(f"wrote {args.out} ({len(views)} views, read-only: this session reads only {args.data}'s tables); "
          f"open with: duckdb -init {args.out}")


def cmd_cache(args) -> None:
    from pipeline.core.cache import CriticCache, export_parquet, import_parquet

    if args.action != "stats" and not args.file:
        raise ConfigError(f"`drlc cache {args.action}` needs a FILE.parquet argument.")
    with CriticCache(args.dir) as cache:
        if args.action == "stats":
            for key, value in cache.stats().items():
                print(f"{key}: {value}")
        elif args.action == "export":
            print(f"exported {export_parquet(cache, args.file)} entries to {args.file}")
        else:
            print(f"imported {import_parquet(cache, args.file)} new entries from {args.file}")


def cmd_critic_serve(args) -> None:
    if args.engine == "vllm":
        from pipeline.critic.vllm_server import serve_vllm_forever

        drlc_only = [f"--{name.replace('_', '-')}" for name, default in _DRLC_SERVE_DEFAULTS.items()
                     if getattr(args, name) != default]
        if drlc_only:
            raise ConfigError(f"drlc critic serve --engine vllm: {', '.join(drlc_only)} set options of drlc's own "
                              f"server (--engine drlc); drop them")
        serve_vllm_forever(args.model_dir, host=args.host, port=args.port, served_model_name=args.served_model_name,
                           gpu_memory_utilization=args.gpu_memory_utilization, max_model_len=args.max_model_len,
                           enforce_eager=args.enforce_eager)  # execs vLLM: does not return
    from pipeline.critic.offline.server import serve_forever

    serve_forever(host=args.host, port=args.port, backend=args.backend, model_dir=args.model_dir, latency_s=args.latency,
                  error_rate=args.error_rate, rate_limit_rate=args.rate_limit_rate,
                  garbage_rate=args.garbage_rate, drop_rate=args.drop_rate, empty_rate=args.empty_rate,
                  seed=args.seed, layout=args.layout)


def cmd_report(args) -> None:
    from pipeline.commands.report import write_report

    paths = write_report(args.runs, args.out)
    for kind, path in paths.items():
        print(f"{kind}: {path}")


def cmd_view(args) -> None:
    from pipeline.commands.view import write_view

    print(f"wrote {write_view(args.run, args.out, args.tokenizer)}")


def cmd_replay(args) -> None:
    from pipeline.commands.replay import replay
    from pipeline.commands.replay_dvc import write_dvc_replay

    if args.dvc and not args.evaluate:
        raise ConfigError("--no-evaluate does not apply with --dvc: run `dvc repro OUT/dvc.yaml:replay` "
                          "to train without evaluating.")
    if args.dvc:
        write_dvc_replay(args.run, args.out, overrides=args.set, allow_new_calls=args.allow_new_calls)
    else:
        replay(args.run, args.out, overrides=args.set, allow_new_calls=args.allow_new_calls, evaluate=args.evaluate)


def cmd_batch_prepare(args) -> None:
    from pipeline.core import store
    from pipeline.core.cache import CriticCache
    from pipeline.core.config import load_params
    from pipeline.critic.annotate import round_requests
    from pipeline.critic.batch import batch_prepare
    from pipeline.critic.templates import load_template
    from pipeline.steps.critique import critic_client, scored_rows
    from pipeline.tasks import get_task

    params = load_params(args.params)
    critic = params.critic
    if critic.answer_format != "text" or critic.samples != 1:
        raise ConfigError(f"critic batch prepare writes text requests with one sample; critic.answer_format "
                          f"{critic.answer_format!r} / critic.samples {critic.samples} are live-only: set "
                          "critic.answer_format: text and critic.samples: 1, or run the round live")
    rows = scored_rows(store.read_table(store.round_partition(args.data, "rollouts", int(args.round)), "rollouts"),
                       store.read_table(store.round_partition(args.data, "scores", int(args.round)), "scores"))
    fields = get_task(params.run.task).critic_fields
    template = load_template(critic.template, task=params.run.task, labels=critic.labels, fields=fields)
    requests = round_requests(rows, template=template, threshold=critic.threshold, fields=fields)
    client = critic_client(critic, None, template_sha=template.sha256)  # for its cache keys; sends nothing
    with CriticCache(critic.cache_dir) as cache:
        n = batch_prepare(requests, client=client, cache=cache, out_path=args.out)
    print(f"wrote {n} uncached requests of round {args.round} to {args.out}")


def cmd_batch_ingest(args) -> None:
    from pipeline.core.cache import CriticCache
    from pipeline.core.config import load_params
    from pipeline.critic.batch import batch_ingest

    with CriticCache(load_params(args.params).critic.cache_dir) as cache:
        counts = batch_ingest(args.file, cache=cache)
    print(", ".join(f"{k}: {v}" for k, v in counts.items()))


def _audit_name(args, critic) -> str:
    """--name, or `<span file stem>-<critic.model>` with characters unsafe in a folder name replaced."""
    name = args.name or f"{Path(args.spans).stem}-{critic.model}"
    if args.name and not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        raise ConfigError(f"--name {name!r}: use letters, digits, '.', '_' and '-' only (it names a folder)")
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def _audit_args(args, name: str, out: str) -> list[str]:
    """The `drlc critic eval` arguments that reproduce this audit (for its DVC stage)."""
    argv = ["--params", args.params, "--spans", args.spans, "--name", name, "--data", args.data, "--out", out,
            "--seed", str(args.seed), "--span-iou", str(args.span_iou), "--base-model", args.base_model]
    argv += ["--train", args.train] if args.train else []
    argv += ["--limit", str(args.limit)] if args.limit is not None else []
    argv += [] if args.references else ["--no-references"]
    return argv + [item for assignment in args.set for item in ("--set", assignment)]


def cmd_critic_eval(args) -> None:
    from pipeline.core.config import load_params

    params = load_params(args.params, args.set)
    critic = params.critic
    name = _audit_name(args, critic)
    out = args.out or f"reports/critic_eval/{name}"
    if args.dvc:
        from pipeline.audit.dvc_stage import write_audit_stage

        path = write_audit_stage(args.dvc, args=_audit_args(args, name, out), params=args.params,
                                 template=critic.template, inputs=[args.spans] + ([args.train] if args.train else []),
                                 data_dir=args.data, out_dir=out, audit=name)
        print(f"wrote stage critic_eval to {path}; run: dvc repro {path}")
        return
    from pipeline.audit.critic_eval import audit_critic, write_audit

    rows, summary = audit_critic(spans_path=args.spans, critic=critic, task=params.run.task,
                                 train_path=args.train, limit=args.limit,
                                 seed=args.seed, iou=args.span_iou, references=args.references,
                                 base_dir=args.base_model, audit=name)
    paths = write_audit(rows, summary, data_dir=args.data, out_dir=out)
    configured = summary["critics"]["configured"]
    print(f"critic eval {name}: {summary['n_posts']} posts, char F1 {configured['char_f1']:.3f}, "
          f"{configured['requests_sent']} requests sent, {configured['cache_hits']} cache hits")
    for kind, path in paths.items():
        print(f"{kind}: {path}")


def cmd_critic_distill(args) -> None:
    from pipeline.audit.distill import distill, examples_from_file, examples_from_run
    from pipeline.core.config import load_params
    from pipeline.critic.templates import load_template
    from pipeline.tasks import get_task

    if bool(args.spans) == bool(args.run_data):
        raise ConfigError("`drlc critic distill` needs exactly one source: --spans FILE (labelled spans) "
                          "or --run-data DIR (a run's annotations)")
    params = load_params(args.params, args.set)
    task = params.run.task
    labels = load_template(params.critic.template, task=task, labels=params.critic.labels,
                           fields=get_task(task).critic_fields).labels
    if args.spans:
        examples, source = examples_from_file(args.spans, labels=labels), args.spans
    else:
        examples = examples_from_run(args.run_data, labels=labels, query=args.query)
        source = f"{args.run_data}" + (f" query: {args.query}" if args.query else "")
    card = distill(examples, labels=labels, out_dir=args.out, source=source, seed=args.seed,
                   heldout_share=args.heldout_share)
    held = card["heldout"]
    print(f"distilled a tagger for {card['labels']} from {card['n_train']} texts into {args.out} "
          f"(held-out {card['n_heldout']}: char F1 {held['char_f1']:.3f}); model {card['model_hash'][:12]}")


def _add_distill_parser(critic_sub) -> None:
    distill = critic_sub.add_parser("distill", help="train a span tagger (critic.backend: tagger) from labelled "
                                                    "spans or a run's critic answers")
    distill.add_argument("--params", default="params.yaml", help="params file: its task and critic template "
                                                                 "give the labels")
    distill.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a key")
    distill.add_argument("--spans", default=None, help="labelled posts: SemEval .csv (spans,text) or drlc .jsonl")
    distill.add_argument("--run-data", default=None, metavar="DIR",
                         help="a run's data folder: train on its critiqued responses' read answers")
    distill.add_argument("--query", default=None, help="with --run-data: a DuckDB query returning text, spans "
                                                       "(default: every answer with status ok or none)")
    distill.add_argument("--out", required=True, help="model folder to write (then critic.model_dir)")
    distill.add_argument("--seed", type=int, default=0, help="seed of the held-out split (default: 0)")
    distill.add_argument("--heldout-share", type=float, default=0.15,
                         help="share of texts held out to tune decoding and score the card (default: 0.15)")
    distill.set_defaults(func=cmd_critic_distill)


def _add_eval_parser(critic_sub) -> None:
    evaluate = critic_sub.add_parser("eval", help="audit the configured critic's spans against human-labelled spans")
    evaluate.add_argument("--params", default="params.yaml", help="params file whose critic section is audited")
    evaluate.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a key")
    evaluate.add_argument("--spans", required=True, help="labelled posts: SemEval .csv (spans,text) or drlc .jsonl")
    evaluate.add_argument("--train", default=None, help="labelled train split for the word-list baseline")
    evaluate.add_argument("--limit", type=int, default=None, help="score a seeded sample of N posts (default: all)")
    evaluate.add_argument("--seed", type=int, default=0, help="seed of the --limit sample (default: 0)")
    evaluate.add_argument("--span-iou", type=float, default=0.5,
                          help="a predicted span matches a gold span of its label at this character IoU (0.5)")
    evaluate.add_argument("--no-references", dest="references", action="store_false",
                          help="score only the configured critic (no lexicon critic, no baselines)")
    evaluate.add_argument("--name", default=None, help="audit name (default: <spans file stem>-<critic.model>)")
    evaluate.add_argument("--data", default="data", help="folder of the critic_eval table (default: data)")
    evaluate.add_argument("--out", default=None, help="folder of summary.json and report.md "
                                                      "(default: reports/critic_eval/NAME)")
    evaluate.add_argument("--base-model", default="models/base", help="the run's base model, for model_dir: base")
    evaluate.add_argument("--dvc", default=None, metavar="DIR",
                          help="write DIR/dvc.yaml with this audit as stage critic_eval instead of running it")
    evaluate.set_defaults(func=cmd_critic_eval)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="drlc", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    check = sub.add_parser("check", help="validate params.yaml and the run's inputs")
    check.add_argument("--params", default="params.yaml")
    check.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a key")
    check.set_defaults(func=cmd_check)

    task = sub.add_parser("task", help="your own task: a reward function in one file")
    task_sub = task.add_subparsers(dest="task_command", required=True)
    new = task_sub.add_parser("new", help="write tasks/NAME.py, tasks/NAME.md and configs/NAME.yaml (runs offline)")
    new.add_argument("name", help="the task's name: a lowercase identifier")
    new.add_argument("--root", default=".", help="the project folder (default: .)")
    new.set_defaults(func=cmd_task_new)
    deps = task_sub.add_parser("deps", help="rewrite dvc.yaml's deps on tasks/: run.task's file, the tasks/ modules "
                                            "it imports and its template, nothing else")
    deps.add_argument("--params", default="params.yaml")
    deps.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a key")
    deps.set_defaults(func=cmd_task_deps)

    rounds = sub.add_parser("rounds", help="set the number of PPO rounds: rewrite params.yaml's rounds and evaluate.policy")
    rounds.add_argument("n", type=int, help="number of rounds (1 to 9999)")
    rounds.add_argument("--params", default="params.yaml")
    rounds.add_argument("--exp", action="store_true",
                        help="print the `dvc exp run -S ...` flags for N rounds instead of editing the file")
    rounds.add_argument("--per-stage", type=int, default=1, metavar="K",
                        help="rounds per DVC stage: K > 1 writes `chunks` of K rounds run in one process "
                             "(docs/chunked-rounds.md); default 1")
    rounds.add_argument("--switch-after", type=int, metavar="R",
                        help="the switch-over: critic.* critiques rounds 1..R, a tagger trained on its answers the "
                             "rest (docs/tagger.md); without it `switch: {}`")
    rounds.set_defaults(func=cmd_rounds)

    sql = sub.add_parser("sql", help="run one read-only DuckDB query over the project's Parquet tables")
    sql.add_argument("query", help='e.g. "SELECT round, avg(env_reward) FROM scores GROUP BY 1"')
    sql.add_argument("--data", default="data", help="folder holding the tables (default: data)")
    sql.add_argument("--format", choices=["table", "csv"], default="table", help="how the result is printed")
    sql.add_argument("--out", metavar="FILE", help="write the result to FILE.csv or FILE.parquet, not the terminal")
    sql.set_defaults(func=cmd_sql)

    catalog = sub.add_parser("catalog", help="write catalog.sql: read-only DuckDB views over the tables")
    catalog.add_argument("--data", default="data")
    catalog.add_argument("--out", default="catalog.sql")
    catalog.set_defaults(func=cmd_catalog)

    replay = sub.add_parser("replay", help="re-run PPO over a finished run's rollouts and cached critic answers")
    replay.add_argument("--from", dest="run", required=True, help="folder of a finished run")
    replay.add_argument("--out", required=True, help="new run folder to write (must not exist)")
    replay.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="change a reward, critic-alignment or PPO setting, e.g. ppo.learning_rate=1e-4")
    replay.add_argument("--allow-new-calls", action="store_true",
                        help="send critic requests that are not cached (e.g. after raising critic.threshold)")
    replay.add_argument("--no-evaluate", dest="evaluate", action="store_false",
                        help="train only: skip evaluating the final policy (no eval tables, no metrics/eval.json)")
    replay.add_argument("--dvc", action="store_true",
                        help="write OUT/params.yaml and OUT/dvc.yaml instead; then run `dvc repro OUT/dvc.yaml`")
    replay.set_defaults(func=cmd_replay)

    add_estimate_parser(sub)
    add_study_parser(sub)

    report = sub.add_parser("report", help="compare finished runs: Markdown table + PNG of curves")
    report.add_argument("runs", nargs="+", help="run folders (each with metrics/eval.json and metrics/rounds.json)")
    report.add_argument("--out", default="reports", help="output folder (default: reports)")
    report.set_defaults(func=cmd_report)

    view = sub.add_parser("view", help="write one HTML page of a run's critic spans and per-token rewards")
    view.add_argument("run", nargs="?", default=".", help="a finished run's folder (default: .)")
    view.add_argument("--out", default=None, help="HTML file to write (default: RUN/reports/view.html)")
    view.add_argument("--tokenizer", default=None, help="tokenizer folder (default: RUN/models/base)")
    view.set_defaults(func=cmd_view)

    cache = sub.add_parser("cache", help="inspect, export or import the critic cache")
    cache.add_argument("action", choices=["stats", "export", "import"])
    cache.add_argument("file", nargs="?", help="Parquet file for export/import")
    cache.add_argument("--dir", default="cache/critic", help="cache folder (default: cache/critic)")
    cache.set_defaults(func=cmd_cache)

    critic = sub.add_parser("critic", help="the critic: local server, Batch API, audit against labelled spans")
    critic_sub = critic.add_subparsers(dest="critic_command", required=True)
    serve = critic_sub.add_parser("serve", help="serve /v1/chat/completions, /v1/models and /stats")
    serve.add_argument("--engine", default="drlc", choices=("drlc", "vllm"),
                       help="drlc: drlc's own server (the backends below); vllm: vLLM's OpenAI server for the "
                            "model folder --model-dir (the vllm extra; docs/critic-answers.md)")
    serve.add_argument("--served-model-name", default=None, help="vllm: the name requests send (critic.model; "
                                                                     "default: the folder's name)")
    serve.add_argument("--gpu-memory-utilization", type=float, default=0.2,
                       help="vllm: share of the GPU's memory (on a CPU: of RAM) it reserves (default 0.2)")
    serve.add_argument("--max-model-len", type=int, default=4096, help="vllm: longest prompt + answer, in tokens")
    serve.add_argument("--enforce-eager", action="store_true", help="vllm: no graph compile (starts ~3x faster "
                                                                    "on a CPU, decodes slower)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--backend", default="lexicon", help=" | ".join(CRITIC_BACKENDS))
    serve.add_argument("--model-dir", default=None,
                       help="local chat-model checkpoint for --backend hf, model folder of `drlc critic distill` "
                            "for --backend tagger or random_spans")
    serve.add_argument("--layout", default="drlc", choices=LAYOUTS,
                       help="layout of the lexicon backend's answers (default: drlc, the templates' own format)")
    serve.add_argument("--latency", type=float, default=0.0, help="seconds added to every answer")
    serve.add_argument("--error-rate", type=float, default=0.0, help="share of answers that are HTTP 500")
    serve.add_argument("--rate-limit-rate", type=float, default=0.0, help="share answered 429 + Retry-After")
    serve.add_argument("--garbage-rate", type=float, default=0.0, help="share answered with a broken body")
    serve.add_argument("--drop-rate", type=float, default=0.0, help="share of connections dropped")
    serve.add_argument("--empty-rate", type=float, default=0.0, help="share answered 200 with empty content")
    serve.add_argument("--seed", type=int, default=0)
    serve.set_defaults(func=cmd_critic_serve)
    prepare = critic_sub.add_parser("batch-prepare", help="write a round's uncached requests as Batch-API JSONL")
    prepare.add_argument("--round", required=True, help="round key, e.g. 0001")
    prepare.add_argument("--out", required=True, help="JSONL file to write (custom_id = cache key)")
    prepare.add_argument("--params", default="params.yaml")
    prepare.add_argument("--data", default="data")
    prepare.set_defaults(func=cmd_batch_prepare)
    ingest = critic_sub.add_parser("batch-ingest", help="load a Batch-API output JSONL into the critic cache")
    ingest.add_argument("file", help="the batch output JSONL")
    ingest.add_argument("--params", default="params.yaml")
    ingest.set_defaults(func=cmd_batch_ingest)
    _add_eval_parser(critic_sub)
    _add_distill_parser(critic_sub)
    return p


# `drlc critic serve` options that only drlc's own server reads, with their defaults (--engine vllm refuses them)
_DRLC_SERVE_DEFAULTS = {"backend": "lexicon", "layout": "drlc", "latency": 0.0, "error_rate": 0.0,
                        "rate_limit_rate": 0.0, "garbage_rate": 0.0, "drop_rate": 0.0, "empty_rate": 0.0, "seed": 0}


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except DrlcError as error:
        print(f"drlc: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
