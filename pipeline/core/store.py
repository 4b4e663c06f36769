"""Parquet tables and the DuckDB catalog over them.

Tables are hive-partitioned by round: `data/<table>/round=NNNN/part-0.parquet`. Chunked rounds
(run.rounds_per_stage > 1, docs/chunked-rounds.md) put the same round partitions one folder
deeper, under the chunk stage's output: `data/<table>/chunk=KKKK/round=NNNN/part-0.parquet`.
Readers find partitions in both layouts through `round_partition`, `partition_files` and the
catalog's views (`LAYOUTS`), never by globbing `round=*` themselves. Each partition is written
atomically (temporary file in the same folder, then rename), so a killed stage never leaves a
half-written file. Every table has a fixed Arrow schema below; a row with a
missing or extra column is a bug and raises StoreError before anything is written.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.core.atomic import atomic_file, write_text
from pipeline.core.errors import StoreError
from pipeline.core.integrity import repair_hint

if TYPE_CHECKING:  # duckdb is imported by the functions that query (drlc sql), not by a stage that writes tables
    import duckdb

KEYS = [("run_id", pa.string()), ("round", pa.int32())]
SPAN = pa.struct(
    [("label", pa.string()), ("text", pa.string()), ("start", pa.int32()),
     ("end", pa.int32()), ("reward", pa.float64())]
)

LABELLED_RANGE = pa.struct([("label", pa.string()), ("start", pa.int32()), ("end", pa.int32())])
ITEM = pa.struct([("label", pa.string()), ("text", pa.string())])
DROPPED = pa.struct([("label", pa.string()), ("text", pa.string()), ("reason", pa.string())])

SCHEMAS: dict[str, pa.Schema] = {
    "prompts": pa.schema(KEYS + [
        ("prompt_id", pa.string()), ("split", pa.string()), ("text", pa.string()),
        ("reference", pa.string()),
    ]),
    "rollouts": pa.schema(KEYS + [
        ("rollout_id", pa.string()), ("prompt_id", pa.string()), ("query", pa.string()),
        ("response", pa.string()), ("query_ids", pa.list_(pa.int32())),
        ("response_ids", pa.list_(pa.int32())), ("behaviour_logprobs", pa.list_(pa.float32())),
        ("seed", pa.int64()), ("max_new_tokens", pa.int32()), ("policy", pa.string()),
    ]),
    "scores": pa.schema(KEYS + [
        # env_reward: the task's units; env_reward_shaped: score.scale then score.normalize (rewards/shaping.py)
        ("rollout_id", pa.string()), ("env_reward", pa.float64()), ("env_reward_shaped", pa.float64()),
        ("scorer", pa.string()), ("scorer_version", pa.string()),
    ]),
    "annotations": pa.schema(KEYS + [
        ("rollout_id", pa.string()), ("critiqued", pa.bool_()), ("status", pa.string()),
        ("cache_key", pa.string()), ("cache_hit", pa.bool_()), ("critic_model", pa.string()),
        ("template_sha", pa.string()), ("raw_text", pa.string()), ("items", pa.list_(ITEM)),
        ("spans", pa.list_(SPAN)), ("dropped", pa.list_(DROPPED)),
        ("token_rewards", pa.list_(pa.float64())), ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()), ("cost_usd", pa.float64()), ("attempts", pa.int32()),
        ("error", pa.string()),
    ]),
    "ppo_steps": pa.schema(KEYS + [
        ("step", pa.int32()), ("epoch", pa.int32()), ("policy_loss", pa.float64()),
        ("value_loss", pa.float64()), ("approx_kl", pa.float64()), ("policy_kl", pa.float64()),
        ("clipfrac", pa.float64()), ("vf_clipfrac", pa.float64()), ("entropy", pa.float64()),
        ("ratio_mean", pa.float64()), ("skipped", pa.bool_()), ("grad_norm", pa.float64()),
        ("lr", pa.float64()), ("kl", pa.float64()), ("kl_coef", pa.float64()),
        ("env_reward_shaped_mean", pa.float64()), ("intrinsic_reward_sum", pa.float64()),
        ("behaviour_logprob_gap", pa.float64()), ("tokens_per_s", pa.float64()),
    ]),
    # the ppo stage: per response, the KL part of each response token's reward (pipeline/train/ppo.py
    # token_kl_rewards; null for grpo, whose KL is a loss term); `drlc view` shades tokens by it
    "kl_rewards": pa.schema(KEYS + [
        ("rollout_id", pa.string()), ("algorithm", pa.string()), ("kl_penalty", pa.string()),
        ("kl_coef", pa.float64()), ("kl_reward", pa.list_(pa.float64())),
    ]),
    "eval": pa.schema(KEYS + [
        ("policy", pa.string()), ("metric", pa.string()), ("value", pa.float64()), ("n", pa.int64()),
    ]),
    "eval_samples": pa.schema(KEYS + [
        ("policy", pa.string()), ("prompt_id", pa.string()), ("sample", pa.int32()),
        ("prompt_set", pa.string()), ("query", pa.string()), ("response", pa.string()),
        ("env_reward", pa.float64()), ("positive_prob", pa.float64()), ("perplexity", pa.float64()),
        ("rm_score", pa.float64()),  # summarization with evaluate.reward_model; absent in older tables (read as null)
    ]),
    # `drlc critic eval`: one row per (critic, post) of an audit (pipeline/audit/critic_eval.py)
    "critic_eval": pa.schema([
        ("audit", pa.string()), ("critic", pa.string()), ("critic_model", pa.string()), ("line", pa.int64()),
        ("post_id", pa.string()), ("text", pa.string()), ("status", pa.string()),
        ("gold_spans", pa.list_(LABELLED_RANGE)), ("pred_spans", pa.list_(LABELLED_RANGE)),
        ("proposed_spans", pa.int32()), ("absent_spans", pa.int32()), ("char_f1", pa.float64()),
        ("n_gold_spans", pa.int32()), ("n_pred_spans", pa.int32()), ("matched_pred", pa.int32()),
        ("matched_gold", pa.int32()), ("cache_hit", pa.bool_()), ("cost_usd", pa.float64()),
        ("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64()), ("raw_text", pa.string()),
        ("error", pa.string()),
    ]),
}
# The partition key of each table's folders (<table>/<key>=<value>/part-0.parquet); default: round
PARTITION_KEYS = {"critic_eval": "audit"}

# Columns that measure the machine or the cache rather than the experiment: they legitimately
# differ between a first run and a re-run (a forced re-run hits the cache; speed varies).
VOLATILE_COLUMNS = {"annotations": ["cache_hit", "attempts"], "ppo_steps": ["tokens_per_s"]}


# Where a table's partitions sit under data/<table>/: per-round stages, and chunk stages
LAYOUTS = ("{key}=*/part-0.parquet", "chunk=*/{key}=*/part-0.parquet")


def partition_dir(root: str | Path, table: str, round_: int) -> Path:
    return Path(root) / table / f"round={round_:04d}"


def chunk_dir(root: str | Path, table: str, chunk: str) -> Path:
    """The output folder of one chunk stage for `table`; it holds that chunk's round=NNNN partitions."""
    return Path(root) / table / f"chunk={chunk}"


def planned_partition(table: str, round_: int, chunks: dict) -> str:
    """round_'s partition folder of `table` relative to the data root, from the params' `chunks` mapping
    ({first round key: {last: ...}}; empty for one stage per round): for readers of a revision, not a folder."""
    chunk = next((key for key, item in chunks.items() if int(key) <= round_ <= int(item["last"])), None)
    return f"{table}/round={round_:04d}" if chunk is None else f"{table}/chunk={chunk}/round={round_:04d}"


def round_partition(root: str | Path, table: str, round_: int) -> Path:
    """The folder holding round_'s partition of `table` in either layout (the per-round one if neither exists)."""
    flat = partition_dir(root, table, round_)
    if flat.exists():
        return flat
    nested = sorted((Path(root) / table).glob(f"chunk=*/round={round_:04d}"))
    return nested[0] if nested else flat


def partition_files(root: str | Path, table: str) -> list[Path]:
    """Every part-0.parquet of `table` in both layouts, in partition-key order (round order)."""
    key = PARTITION_KEYS.get(table, "round")
    files = [f for layout in LAYOUTS for f in (Path(root) / table).glob(layout.format(key=key))]
    return sorted(files, key=lambda f: (f.parent.name, str(f)))


def audit_dir(root: str | Path, audit: str) -> Path:
    """The critic_eval partition of one audit (`drlc critic eval --name`)."""
    return Path(root) / "critic_eval" / f"audit={audit}"


# columns a table has only when its producer sets them, in every row or in none: rollouts of groups
# (rollout.samples_per_prompt > 1, pipeline/steps/rollout.py); without them a table is byte for byte what it was
OPTIONAL_COLUMNS: dict[str, list[tuple[str, pa.DataType]]] = {
    "prompts": [("columns", pa.string())],  # a task file's prompt fields other than the text, as JSON
    # a task file's declared rewards: {name: value (null: does not apply), "name.key": a dict reward's extra number}
    "scores": [("rewards", pa.map_(pa.string(), pa.float64()))],
    "rollouts": [("group_index", pa.int32()), ("sample_index", pa.int32()),
                 ("engine_logprobs", pa.list_(pa.float32()))],  # rollout.engine vllm: vLLM's log-probs
    # rounds trained on an external engine's rollouts: the old log-prob gap and, with ppo.engine_is_cap, the
    # truncated importance-sampling weights' share capped and mean (pipeline/train/trainer.py engine_correction)
    "ppo_steps": [("engine_logprob_gap_max", pa.float64()), ("engine_logprob_gap_mean", pa.float64()),
                  ("is_capped_share", pa.float64()), ("is_weight_mean", pa.float64())],
}


def table_schema(table: str, rows: list[dict]) -> pa.Schema:
    """SCHEMAS[table], plus its OPTIONAL_COLUMNS when the first row has them."""
    optional = [column for column in OPTIONAL_COLUMNS.get(table, []) if rows and column[0] in rows[0]]
    return pa.schema(list(SCHEMAS[table]) + optional) if optional else SCHEMAS[table]


def write_table(rows: list[dict], table: str, out_dir: str | Path) -> Path:
    """Write rows as `<out_dir>/part-0.parquet` atomically, checked against the table's schema.

    Raises StoreError if a row's columns differ from the schema (OPTIONAL_COLUMNS: all rows or none).
    """
    schema = table_schema(table, rows)
    names = set(schema.names)
    for i, row in enumerate(rows):
        if set(row) != names:
            missing, extra = sorted(names - set(row)), sorted(set(row) - names)
            raise StoreError(f"Row {i} of table '{table}' has missing {missing} / extra {extra} columns.")
    arrow = pa.Table.from_pylist(rows, schema=schema)
    target = Path(out_dir) / "part-0.parquet"
    with atomic_file(target) as temp:
        pq.write_table(arrow, temp)
    return target


def read_table(path: str | Path, table: str | None = None) -> list[dict]:
    """Read one partition folder (or parquet file) into a list of row dicts."""
    path = Path(path)
    file = path if path.suffix == ".parquet" else path / "part-0.parquet"
    if not file.is_file():
        hint = f" Run the stage that writes '{table}' first (dvc repro)." if table else ""
        raise StoreError(f"Table file '{file}' not found.{hint}")
    try:
        with pq.ParquetFile(file) as parquet:  # pq.read_table would import pyarrow.dataset: 0.2 s more per stage
            return parquet.read().to_pylist()
    except (pa.ArrowInvalid, OSError) as error:
        raise StoreError(f"Table file '{file}' is not a readable Parquet file ({str(error).splitlines()[0]}): "
                         f"{repair_hint(file)}.") from None


def connect(data_root: str | Path = "data") -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with one view per table that has data under data_root, for reading them.

    The connection is sandboxed (:func:`read_only`): it reads the tables' folders and nothing else, loads no
    extension, and its configuration is locked. Raises StoreError naming the file when a partition is
    unreadable (connect_skipping_broken names it too).
    """
    con, broken = connect_skipping_broken(data_root)
    if broken:
        raise StoreError(next(iter(broken.values())))
    return con


def connect_skipping_broken(data_root: str | Path = "data") -> tuple[duckdb.DuckDBPyConnection, dict[str, str]]:
    """connect(), but a table with an unreadable partition gets no view: (connection, {table: one-line error}).

    DuckDB reads every file's footer when it creates a view over them, so one corrupt file would
    fail every query; here only the queries that read its table fail (`drlc sql`).
    """
    import duckdb

    con, broken = duckdb.connect(), {}
    # a missing table is DuckDB's own 'does not exist', never a Python variable of that name in the caller
    con.execute("SET python_enable_replacements = false")
    folders = []
    for sql in view_statements(data_root):
        table = sql.split()[4]  # CREATE OR REPLACE VIEW <table> AS ...
        try:
            con.execute(sql)
            folders.append(table_folder(data_root, table))
        except duckdb.Error as error:
            broken[table] = unreadable_partition(Path(data_root), table) or \
                f"Table '{table}' cannot be read: {str(error).splitlines()[0]}"
    read_only(con, folders)
    return con, broken


def table_folder(data_root: str | Path, table: str) -> str:
    """The folder that holds a table's partitions, as DuckDB's allowed_directories takes it."""
    return f"{(Path(data_root) / table).as_posix()}/"


def read_only(con: duckdb.DuckDBPyConnection, folders: list[str]) -> None:
    """Lock con to the tables' folders (:func:`sandbox_statements`)."""
    for sql in sandbox_statements(folders):
        con.execute(sql)


def sandbox_statements(folders: list[str]) -> list[str]:
    """SET statements that confine a DuckDB session to folders: it refuses any other file or URL (reading,
    COPY, ATTACH, EXPORT), installs and loads no extension, and refuses every later SET. Within the folders
    DuckDB would still let a statement write: `drlc sql` runs queries only (pipeline/commands/cli.py
    `query_only`)."""
    return [f"SET allowed_directories = {folders!r}",
            *(f"SET {setting} = false" for setting in ("enable_external_access", "autoinstall_known_extensions",
                                                         "autoload_known_extensions", "allow_community_extensions")),
            "SET lock_configuration = true"]


def unreadable_partition(data_root: Path, table: str) -> str | None:
    """The one-line error for the first partition of `table` whose Parquet footer cannot be read, or None."""
    key = PARTITION_KEYS.get(table, "round")
    for layout in LAYOUTS:
        for path in sorted((data_root / table).glob(layout.format(key=key))):
            try:
                pq.read_metadata(path)
            except (pa.ArrowException, OSError) as error:
                return (f"Table '{table}': Parquet file '{path}' is unreadable ({str(error).splitlines()[0]}); "
                        f"{repair_hint(path)}.")
    return None


def view_statements(data_root: str | Path = "data") -> list[str]:
    """`CREATE VIEW` statements for every table with at least one partition (the catalog)."""
    root = Path(data_root)
    statements = []
    for table in SCHEMAS:
        key = PARTITION_KEYS.get(table, "round")
        globs = [(root / table / layout.format(key=key)).as_posix() for layout in LAYOUTS
                 if any((root / table).glob(layout.format(key=key)))]  # DuckDB rejects a glob that matches nothing
        if globs:
            statements.append(
                f"CREATE OR REPLACE VIEW {table} AS SELECT * FROM read_parquet({globs!r}, "
                f"union_by_name = true, hive_partitioning = false)"
            )
    return statements


def write_lines(lines: list[str], path: str | Path) -> Path:
    """Write one text per line atomically (texts must not contain newlines)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    bad = next((i for i, line in enumerate(lines) if "\n" in line), None)
    if bad is not None:
        raise StoreError(f"Line {bad} of {path} contains a newline; one text per line is required.")
    return write_text(path, "\n".join(lines) + "\n")


def read_lines(path: str | Path) -> list[str]:
    path = Path(path)
    if not path.is_file():
        raise StoreError(f"Text file '{path}' not found: run the stage that writes it first (dvc repro).")
    return path.read_text(encoding="utf-8").splitlines()
