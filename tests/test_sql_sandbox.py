"""`drlc sql`, `drlc catalog` and store.connect() only read the project's tables, and a corrupt output is named
against dvc.lock with the commands that repair it (pipeline/core/store.py, pipeline/core/integrity.py).

Each statement runs through the real CLI (in-process) on real Parquet tables; the slow tests/test_e2e_demo.py
follows the corrupt-output message word for word on a real DVC run."""
import hashlib
import json
import os

import duckdb
import pyarrow.parquet as pq
import pytest
import yaml
from inprocess import drlc
from test_bad_inputs import assert_clean_failure

from pipeline.core import store
from pipeline.core.integrity import file_md5, repair_hint


def scores(round_: int) -> list[dict]:
    return [{"run_id": "t", "round": round_, "rollout_id": f"r{i}", "env_reward": float(i),
             "env_reward_shaped": float(i), "scorer": "vader", "scorer_version": "1"} for i in range(3)]


@pytest.fixture
def project(tmp_path):
    for round_ in (1, 2):
        store.write_table(scores(round_), "scores", tmp_path / f"data/scores/round={round_:04d}")
    return tmp_path


def outside(project):
    return project.parent / f"{project.name}-outside"


@pytest.mark.parametrize("statement, refused", [
    ("COPY (SELECT * FROM scores) TO '{out}/x.csv'", "COPY statement"),
    ("COPY (SELECT * FROM scores) TO 'data/scores/round=0001/part-0.parquet' (FORMAT parquet)", "COPY statement"),
    ("SELECT count(*) FROM read_csv('/etc/passwd')", "Permission Error"),
    ("SELECT * FROM read_text('{out}/secret.txt')", "Permission Error"),
    ("ATTACH '{out}/evil.duckdb'", "ATTACH statement"),
    ("INSTALL httpfs", "LOAD statement"),
    ("SET enable_external_access = true", "SET statement"),
    ("CREATE TABLE t AS SELECT 1", "CREATE statement"),
    ("SELECT 1; SELECT 2", "2 statements"),
])
def test_sql_refuses_in_one_line_and_writes_nothing(project, statement, refused):
    out = outside(project)
    out.mkdir()
    (out / "secret.txt").write_text("not the project's\n")
    before = {p: p.stat().st_mtime_ns for p in project.rglob("*")}
    result = drlc(["sql", statement.format(out=out)], project)
    assert_clean_failure(result, refused)
    if "statement" in refused:  # refused before DuckDB runs it: the line says how to export on purpose
        assert "drlc sql --out FILE.csv" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["secret.txt"]
    assert {p: p.stat().st_mtime_ns for p in project.rglob("*")} == before
    assert drlc(["sql", "SELECT count(*) AS n FROM scores"], project).stdout.split() == ["n", "6"]


def test_connect_reads_the_tables_and_refuses_other_files_extensions_and_settings(project):
    out = outside(project)
    out.mkdir()
    (out / "other.csv").write_text("a\n1\n")
    con = store.connect(project / "data")
    assert con.sql("SELECT round, count(*) FROM scores GROUP BY 1 ORDER BY 1").fetchall() == [(1, 3), (2, 3)]
    for sql in (f"SELECT * FROM read_csv('{out}/other.csv')", f"COPY (SELECT 1) TO '{out}/x.csv'",
                f"ATTACH '{out}/evil.duckdb'", "INSTALL httpfs", "LOAD httpfs"):
        with pytest.raises(duckdb.PermissionException):
            con.execute(sql)
    with pytest.raises(duckdb.InvalidInputException, match="locked"):
        con.execute("SET enable_external_access = true")
    assert sorted(p.name for p in out.iterdir()) == ["other.csv"]


def test_sql_out_writes_the_result_as_csv_or_parquet(project):
    query = "SELECT round, sum(env_reward) AS total FROM scores GROUP BY 1 ORDER BY 1"
    ran = drlc(["sql", "--out", "exports/totals.csv", query], project)
    assert ran.returncode == 0, ran.stderr
    assert (project / "exports/totals.csv").read_text().splitlines() == ['"round","total"', "1,3", "2,3"]
    assert drlc(["sql", "--out", "totals.parquet", query], project).returncode == 0
    assert pq.read_table(project / "totals.parquet").to_pylist() == [{"round": 1, "total": 3.0},
                                                                     {"round": 2, "total": 3.0}]
    assert_clean_failure(drlc(["sql", "--out", "totals.json", query], project), "--out totals.json", ".csv")


def test_catalog_sql_opens_read_only_views(project, monkeypatch):
    ran = drlc(["catalog"], project)
    assert ran.returncode == 0 and "read-only" in ran.stdout, ran.stderr
    con = duckdb.connect()
    monkeypatch.chdir(project)  # catalog.sql names data/ relative to the project, as `duckdb -init` runs it there
    for sql in (project / "catalog.sql").read_text().split(";\n"):
        if sql.strip():
            con.execute(sql)
    assert con.sql("SELECT count(*) FROM scores").fetchall() == [(6,)]
    with pytest.raises(duckdb.PermissionException):
        con.execute("SELECT * FROM read_csv('/etc/passwd')")


def dvc_project(tmp_path, *, linked: bool):
    """A DVC project (dvc init, in process) whose score@0002 wrote data/scores/round=0002, recorded in dvc.lock
    and in the cache as DVC records a folder output: a .dir listing and the file's object, linked or copied."""
    from dvc.repo import Repo

    Repo.init(str(tmp_path), no_scm=True).close()
    file = store.write_table(scores(2), "scores", tmp_path / "data/scores/round=0002")
    md5 = file_md5(file)
    listing = json.dumps([{"md5": md5, "relpath": "part-0.parquet"}]).encode()
    dir_md5 = hashlib.md5(listing).hexdigest() + ".dir"
    objects = tmp_path / ".dvc/cache/files/md5"
    for name, write in ((md5, lambda p: os.link(file, p) if linked else p.write_bytes(file.read_bytes())),
                        (dir_md5, lambda p: p.write_bytes(listing))):
        (objects / name[:2]).mkdir(parents=True, exist_ok=True)
        write(objects / name[:2] / name[2:])
    out = {"path": "data/scores/round=0002", "hash": "md5", "md5": dir_md5}
    stages = {"score@0002": {"cmd": "python stages/score.py", "outs": [out]}}
    (tmp_path / "dvc.lock").write_text(yaml.safe_dump({"schema": "2.0", "stages": stages}))
    return file, md5, objects / md5[:2] / md5[2:]


def test_a_truncated_linked_output_gets_cache_removal_then_a_forced_stage(tmp_path, monkeypatch):
    file, md5, obj = dvc_project(tmp_path, linked=True)
    monkeypatch.chdir(tmp_path)
    file.write_bytes(file.read_bytes()[:40])  # in place: the cache's object is the same file
    hint = repair_hint(file)
    assert f"dvc.lock records {md5}" in hint and "so is DVC's cache copy" in hint
    assert hint.endswith(f"run `rm -f {obj.relative_to(tmp_path).as_posix()}`, then `dvc repro -f -s score@0002`")
    result = drlc(["sql", "SELECT count(*) FROM scores"], tmp_path)
    assert_clean_failure(result, "data/scores/round=0002/part-0.parquet", "is unreadable", "dvc repro -f -s score@0002")


def test_a_truncated_copied_output_gets_a_checkout_from_the_intact_cache(tmp_path, monkeypatch):
    file, md5, _ = dvc_project(tmp_path, linked=False)
    monkeypatch.chdir(tmp_path)
    file.write_bytes(file.read_bytes()[:40])
    assert repair_hint(file).endswith("restore it with `dvc checkout --force data/scores/round=0002`")
    with pytest.raises(store.StoreError, match="dvc checkout --force data/scores/round=0002"):
        store.read_table(file.parent, "scores")
