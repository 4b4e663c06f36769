"""docs/results.md's "Query the run" section is benchmarks/results/demo_queries.json rendered, and its SQL is
the SQL run.

Fast: no model, no DVC. A hand edit of that section, of the JSON, or of a query in
benchmarks/demo_queries.py without re-running it fails here.
"""
from __future__ import annotations

import json
import platform
import sys
from pathlib import Path

import pytest

from benchmarks import demo_queries
from benchmarks.demo_queries import BLOCK_END, BLOCK_START, QUERIES, RESULT, render, run_queries, splice_block
from pipeline.core import store
from pipeline.core.errors import DataError

ROOT = Path(__file__).resolve().parents[1]


def test_results_section_is_the_committed_json_rendered():
    result = json.loads(RESULT.read_text())
    page = (ROOT / "docs" / "results.md").read_text()
    section = page.split(BLOCK_START, 1)[1].split(BLOCK_END, 1)[0]
    assert section == "\n" + render(result), "docs/results.md's demo-queries section differs from the JSON: " \
        "re-run `python benchmarks/demo_queries.py --project <fresh demo run> --doc docs/results.md`"


def test_committed_json_ran_the_scripts_queries():
    result = json.loads(RESULT.read_text())
    assert [(q["key"], q["sql"], q["intro"], q["note"]) for q in result["queries"]] == \
        [(q.key, q.sql, q.intro, q.note) for q in QUERIES]
    p = result["provenance"]
    assert len(p["git_commit"]) == 40 and p["torch_threads"] >= 1 and p["dvc_lock_sha256"]


def _annotation(round_: int, i: int, *, status: str, env: float, hit: bool = False) -> dict:
    critiqued = status != "skipped"
    spans = [{"label": "negative", "text": "Awful", "start": 0, "end": 5, "reward": -0.5}] if status == "ok" else []
    dropped = [{"label": "negative", "text": "gone", "reason": "not in the response"}] if status == "no_match" else []
    return {"run_id": "r", "round": round_, "rollout_id": f"{round_}-{i}", "critiqued": critiqued, "status": status,
            "cache_key": "k", "cache_hit": hit, "critic_model": "m", "template_sha": "s", "raw_text": "",
            "items": [], "spans": spans, "dropped": dropped, "token_rewards": [env - 1.0, 0.0],
            "prompt_tokens": 10, "completion_tokens": 2, "cost_usd": 0.0, "attempts": 0 if hit or not critiqued else 1,
            "error": None}


def test_queries_run_on_the_current_schemas(tmp_path, monkeypatch):
    monkeypatch.setattr(demo_queries, "_git", lambda project, *args: "")  # a git process; tmp_path is no repo
    statuses = ["ok", "ok", "no_match", "none", "parse_error", "skipped"]
    rows = [_annotation(1, i, status=s, env=0.1 * i, hit=i == 1) for i, s in enumerate(statuses)]
    store.write_table(rows, "annotations", store.partition_dir(tmp_path / "data", "annotations", 1))
    scores = [{"run_id": "r", "round": 1, "rollout_id": r["rollout_id"], "env_reward": 0.1 * i,
               "env_reward_shaped": 0.1 * i, "scorer": "toy", "scorer_version": "1"} for i, r in enumerate(rows)]
    store.write_table(scores, "scores", store.partition_dir(tmp_path / "data", "scores", 1))
    result = run_queries(tmp_path)
    by_key = {q["key"]: dict(zip(["columns", "rows"], [q["columns"], q["rows"]])) for q in result["queries"]}
    assert by_key["critic_calls"]["rows"] == [[1, 5, 1, 4]]
    assert by_key["statuses"]["rows"] == [[1, 2, 1, 1, 1, 0, 0.2]]
    assert by_key["negative_spans"]["rows"] == [["awful", 2]]
    assert by_key["items"]["rows"] == [[1, 0, 2, 1]]
    assert by_key["reward_correlation"]["rows"][0][0] == 1 and by_key["reward_correlation"]["rows"][0][2] == 5
    markdown = render(result)
    assert "| round | critiqued | cache_hits | critic_requests |\n|---:|---:|---:|---:|\n| 1 | 5 | 1 | 4 |" in markdown
    json.dumps(result)  # every value is plain JSON


@pytest.mark.slow  # platform.platform() runs `uname -p`
@pytest.mark.skipif(sys.platform != "linux", reason="the provenance strings equal the standard library's on Linux")
def test_provenance_names_the_machine_as_before_without_a_process():
    """The committed JSON's machine.platform came from platform.platform(), machine.cpu from /proc/cpuinfo."""
    assert demo_queries.platform_name() == platform.platform()
    model = [line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")]
    assert demo_queries.cpu_name() == (model[0].split(":", 1)[1].strip() if model else platform.machine())


def test_missing_tables_and_markers_are_named(tmp_path):
    with pytest.raises(DataError, match="dvc repro"):
        run_queries(tmp_path)
    with pytest.raises(DataError, match="demo-queries:begin"):
        splice_block("# no markers\n", "x")
    text = f"a\n{BLOCK_START}\nold\n{BLOCK_END}\nb\n"
    assert splice_block(text, "new\n") == f"a\n{BLOCK_START}\nnew\n{BLOCK_END}\nb\n"


def test_cpuinfo_fields_and_vector_flags_are_read_from_a_kernels_cpuinfo(tmp_path):
    """A /proc/cpuinfo as Linux writes it (tab before the colon, one block per CPU): the first block's values."""
    cpuinfo = tmp_path / "cpuinfo"
    block = ("processor\t: {n}\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\n"
             "flags\t\t: fpu sse2 avx2 hypervisor avx512f fma sse avx2 vaes\n\n")
    cpuinfo.write_text(block.format(n=0) + block.format(n=1))
    assert demo_queries._cpuinfo("model name", cpuinfo) == "AMD EPYC"
    assert demo_queries._cpuinfo("bogomips", cpuinfo) is None
    assert demo_queries._cpuinfo("model name", tmp_path / "absent") is None
    assert demo_queries.vector_flags(demo_queries._cpuinfo("flags", cpuinfo)) == \
        ["avx2", "avx512f", "fma", "sse", "sse2"]
