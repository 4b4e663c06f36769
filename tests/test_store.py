"""Parquet tables: schema checks, atomic writes, and the DuckDB catalog over partitions."""
import pytest

from pipeline.core import store
from pipeline.core.errors import StoreError


def score_row(round_, i, reward):
    return {"run_id": "t", "round": round_, "rollout_id": f"r{round_}-{i}", "env_reward": reward,
            "env_reward_shaped": reward, "scorer": "vader", "scorer_version": "3.3.2"}


def test_write_then_read_round_trip(tmp_path):
    rows = [score_row(1, i, i / 10) for i in range(3)]
    path = store.write_table(rows, "scores", store.partition_dir(tmp_path, "scores", 1))
    assert path == tmp_path / "scores" / "round=0001" / "part-0.parquet"
    assert store.read_table(path.parent) == rows
    assert [p.name for p in path.parent.iterdir()] == ["part-0.parquet"]  # no temp file left


def test_wrong_columns_raise_before_writing(tmp_path):
    row = score_row(1, 0, 0.5)
    del row["scorer"]
    with pytest.raises(StoreError, match=r"missing \['scorer'\]"):
        store.write_table([row], "scores", tmp_path / "scores" / "round=0001")
    assert not (tmp_path / "scores" / "round=0001" / "part-0.parquet").exists()


def test_missing_table_names_the_file(tmp_path):
    with pytest.raises(StoreError, match="not found"):
        store.read_table(tmp_path / "scores" / "round=0001", "scores")


def test_catalog_views_span_all_rounds(tmp_path):
    for r in (1, 2):
        store.write_table([score_row(r, i, r + i) for i in range(2)], "scores",
                          store.partition_dir(tmp_path, "scores", r))
    con = store.connect(tmp_path)
    assert con.sql("SELECT round, sum(env_reward) FROM scores GROUP BY 1 ORDER BY 1").fetchall() == [
        (1, 3.0), (2, 5.0)]
    assert "rollouts" not in [r[0] for r in con.sql("SHOW TABLES").fetchall()]


def test_lines_reject_embedded_newlines(tmp_path):
    store.write_lines(["a b", "c"], tmp_path / "x.txt")
    assert store.read_lines(tmp_path / "x.txt") == ["a b", "c"]
    with pytest.raises(StoreError, match="newline"):
        store.write_lines(["a\nb"], tmp_path / "y.txt")


def test_planned_partition_finds_the_chunk_that_ran_a_round():
    chunks = {"0001": {"prev": "base", "last": "0004"}, "0005": {"prev": "round=0004", "last": "0008"}}
    assert store.planned_partition("scores", 1, chunks) == "scores/chunk=0001/round=0001"
    assert store.planned_partition("scores", 4, chunks) == "scores/chunk=0001/round=0004"
    assert store.planned_partition("annotations", 5, chunks) == "annotations/chunk=0005/round=0005"
    assert store.planned_partition("scores", 3, {}) == "scores/round=0003"
