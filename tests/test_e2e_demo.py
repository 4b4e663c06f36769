"""The demo DAG end to end on a shrunken config: real DVC, real HTTP critic, real tiny GPT-2.

One run of a few minutes checks: every table is written; a second `dvc repro` does nothing;
`dvc repro --force` sends zero requests to the critic server and reproduces every table's
content; and the policy's env reward rises from the first round to the last.
"""
import json
import re
import shutil
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from e2e import dvc, make_project, run, tiny_params

from pipeline.core.device import stage_devices
from pipeline.core.integrity import file_md5
from pipeline.core.store import VOLATILE_COLUMNS, connect

pytestmark = pytest.mark.slow  # every test here runs `dvc repro` (or uses a fixture that does)

TABLES = ["prompts", "rollouts", "scores", "annotations", "ppo_steps", "eval", "eval_samples"]


def table_contents(project: Path) -> dict:
    """Every Parquet table's rows (minus volatile columns), keyed by file path."""
    contents = {}
    for file in sorted((project / "data").glob("*/round=*/part-0.parquet")):
        table = pq.read_table(file)
        drop = [c for c in VOLATILE_COLUMNS.get(file.parent.parent.name, []) if c in table.column_names]
        contents[str(file.relative_to(project))] = table.drop(drop).to_pylist()
    return contents


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("demo"), tiny_params(n_rounds=3))
    dvc(["repro"], project)
    return project


def test_every_table_is_written(finished_run):
    for table in TABLES:
        assert list((finished_run / "data" / table).glob("round=*/part-0.parquet")), table
    eval_metrics = json.loads((finished_run / "metrics" / "eval.json").read_text())
    assert set(eval_metrics) == {"base", "round=0003"}
    curves = json.loads((finished_run / "metrics" / "rounds.json").read_text())["rounds"]
    assert [c["round"] for c in curves] == [1, 2, 3]
    assert sum(c["critiqued"] for c in curves) > 0 and sum(c["critic_requests"] for c in curves) > 0


def test_every_stage_records_where_it_ran_its_model(finished_run):
    """run.device auto on this CUDA-less machine: every model on the CPU; VADER and the lexicon critic have none."""
    rounds = ["0001", "0002", "0003"]
    expected = {"base": "cpu", "evaluate": "cpu",
                **{f"{stage}@{r}": "cpu" for stage in ("rollout", "ppo") for r in rounds},
                **{f"{stage}@{r}": None for stage in ("score", "critique") for r in rounds}}
    assert stage_devices(finished_run / "metrics") == expected
    rollout = json.loads((finished_run / "metrics" / "rollout" / "round=0001.json").read_text())
    assert rollout["rows"] == 32 and rollout["response_tokens"] > 0 and rollout["tokens_per_s"] > 0
    score = json.loads((finished_run / "metrics" / "score" / "round=0001.json").read_text())
    assert score["rows"] == 32 and score["scorer"] == "vader"


def test_env_reward_rises_from_first_to_last_round(finished_run):
    curves = json.loads((finished_run / "metrics" / "rounds.json").read_text())["rounds"]
    assert curves[-1]["env_reward_mean"] > curves[0]["env_reward_mean"], curves


def test_second_repro_does_nothing_and_forced_rerun_is_free_and_identical(finished_run):
    before = table_contents(finished_run)
    again = dvc(["repro"], finished_run)
    assert "Running stage" not in again.stdout, again.stdout
    forced = dvc(["repro", "--force"], finished_run)
    assert forced.stdout.count("Running stage") >= 2 + 4 * 3 + 1
    for metrics in sorted((finished_run / "metrics" / "critique").glob("*.json")):
        data = json.loads(metrics.read_text())
        assert data["critic_requests"] == 0 and data["critic_retries"] == 0, (metrics.name, data)
        assert data["cache_hits"] == data["critiqued"] and data["critic_error_rate"] == 0.0
    curves = json.loads((finished_run / "metrics" / "rounds.json").read_text())["rounds"]
    assert [c["critic_requests"] for c in curves] == [0, 0, 0]  # a free re-run plots zero requests, not the hits
    assert all(c["cache_hits"] == c["critiqued"] > 0 for c in curves), curves
    assert table_contents(finished_run) == before


def readme_queries() -> list[str]:
    """Every ```sql block of README.md and docs/results.md (the demo queries' generated block)."""
    root = Path(__file__).resolve().parents[1]
    text = "\n".join((root / page).read_text() for page in ("README.md", "docs/results.md"))
    return re.findall(r"```sql\n(.*?)```", text, flags=re.S)


def test_readme_queries_run_on_a_finished_run(finished_run):
    queries = readme_queries()
    assert len(queries) >= 5
    con = connect(finished_run / "data")
    for query in queries:
        assert con.sql(query).fetchall(), query


def test_batch_prepare_writes_one_line_per_uncached_request(finished_run, tmp_path):
    params = yaml.safe_load((finished_run / "params.yaml").read_text())
    params["critic"]["cache_dir"] = str(tmp_path / "empty-cache")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    out = tmp_path / "batch.jsonl"
    run([sys.executable, "-m", "pipeline", "critic", "batch-prepare", "--round", "0001", "--out", str(out),
         "--params", str(tmp_path / "params.yaml")], finished_run)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    annotations = pq.read_table(finished_run / "data" / "annotations" / "round=0001" / "part-0.parquet")
    keys = {k for k in annotations.column("cache_key").to_pylist() if k}  # the round's distinct requests
    assert len(lines) == len(keys) > 0 and {line["custom_id"] for line in lines} == keys


@pytest.mark.long  # a second full run as a DVC experiment
def test_sparse_baseline_is_one_dvc_exp_run_and_report_compares_both(finished_run, tmp_path):
    sparse = tmp_path / "sparse"
    shutil.copytree(finished_run, sparse, symlinks=True)
    run(["git", "add", "-A"], sparse)
    run(["git", "-c", "user.name=drlc-test", "-c", "user.email=test@localhost", "commit", "-qm", "dense run"], sparse)
    dvc(["exp", "run", "-S", "critic.enabled=false"], sparse)
    curves = json.loads((sparse / "metrics" / "rounds.json").read_text())["rounds"]
    assert [(c["critiqued"], c["critic_requests"]) for c in curves] == [(0, 0)] * 3

    report = run([sys.executable, "-m", "pipeline", "report", str(finished_run), str(sparse),
                  "--out", str(tmp_path / "report")], finished_run)
    assert "curves.png" in report.stdout and (tmp_path / "report" / "curves.png").stat().st_size > 10_000
    table = (tmp_path / "report" / "report.md").read_text()
    for column, project in enumerate((finished_run, sparse)):
        final = json.loads((project / "metrics" / "eval.json").read_text())["round=0003"]["world"]
        row = next(line for line in table.splitlines() if line.startswith("| final/world/positive_percent |"))
        assert float(row.split("|")[2 + column]) == pytest.approx(final["positive_percent"], rel=1e-3)


def test_bad_params_stop_the_dag_with_one_line_and_keep_finished_outputs(finished_run):
    params_file = finished_run / "params.yaml"
    original = params_file.read_text()
    kept = sorted(p for p in (finished_run / "data").rglob("*.parquet")
            if "ppo_steps" not in str(p) and "kl_rewards" not in str(p))  # the ppo stage's outputs: DVC removes them first
    kept += sorted((finished_run / "models" / "base").iterdir())
    before = {p: p.read_bytes() for p in kept}
    params_file.write_text(original.replace("  cliprange: 0.2\n", "  cliprange: 0.2\n  clip_range: 0.3\n"))
    try:
        result = dvc(["repro"], finished_run, check=False)
    finally:
        params_file.write_text(original)
    assert result.returncode != 0
    errors = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("drlc: error:")]
    assert len(errors) == 1 and "ppo.clip_range" in errors[0] and "cliprange" in errors[0], errors
    assert {p: p.read_bytes() for p in kept} == before



def test_a_truncated_output_is_repaired_by_following_drlc_sql_word_for_word(finished_run):
    """With the project's own cache.type (hardlinks, docs/disk.md), truncating an output in place corrupts its
    cache copy too; drlc sql names it against dvc.lock, and its commands, run as written, repair it."""
    dvc(["config", "cache.type", "hardlink,symlink"], finished_run)
    dvc(["checkout", "--relink"], finished_run)
    count = "SELECT count(*) AS n FROM scores"
    rows = connect(finished_run / "data").sql(count).fetchall()[0][0]
    file = finished_run / "data/scores/round=0002/part-0.parquet"
    assert file.stat().st_nlink == 2  # the workspace file is the cache object
    file.chmod(0o644)
    file.write_bytes(file.read_bytes()[:40])
    failed = run([sys.executable, "-m", "pipeline", "sql", count], finished_run, check=False)
    assert failed.returncode == 2 and "is corrupt" in failed.stderr, failed.stderr
    commands = re.findall(r"`([^`]+)`", failed.stderr.split("cannot restore it: run ")[1])
    assert [c.split()[:2] for c in commands] == [["rm", "-f"], ["dvc", "repro"]], failed.stderr
    for command in commands:
        words = command.split()
        run(words, finished_run) if words[0] == "rm" else dvc(words[1:], finished_run)
    repaired = run([sys.executable, "-m", "pipeline", "sql", count], finished_run)
    assert repaired.stdout.split() == ["n", str(rows)]
    recorded = re.search(r"dvc\.lock records (\w+)", failed.stderr).group(1)
    assert file_md5(file) == recorded  # the file dvc.lock records again, so the stages after it stay up to date
