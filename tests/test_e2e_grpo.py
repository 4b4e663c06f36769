"""configs/demo-grpo.yaml end to end with `dvc repro`: GRPO with the critic's tokens, groups of 4, no value head.

Shrunk as the PPO demo's test (tests/e2e.py tiny_params): 2 rounds of 32 responses = 8 prompts x 4. A forced
re-run replays the critic from its cache (0 requests) and reproduces every table. `drlc report`, `drlc sql`,
`drlc catalog` and the demo queries of docs/results.md (benchmarks/demo_queries.py) read the run as they read a PPO run.
"""
import json

import pyarrow.parquet as pq
import pytest
from e2e import dvc, make_project, tiny_params
from test_e2e_demo import table_contents

from benchmarks.demo_queries import QUERIES, run_queries
from pipeline.commands.cli import main
from pipeline.core.store import connect

pytestmark = pytest.mark.slow  # runs `dvc repro`


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    project = make_project(tmp_path_factory.mktemp("grpo"), tiny_params(n_rounds=2, profile="demo-grpo"))
    dvc(["repro"], project)
    return project


def test_the_rounds_sample_groups_and_train_without_a_value_head(finished_run):
    for round_ in ("0001", "0002"):
        rollouts = pq.read_table(finished_run / f"data/rollouts/round={round_}/part-0.parquet").to_pylist()
        assert len(rollouts) == 32
        assert [r["sample_index"] for r in rollouts] == [i % 4 for i in range(32)]
        assert all(len({r["prompt_id"] for r in rollouts[g : g + 4]}) == 1 for g in range(0, 32, 4))
        steps = pq.read_table(finished_run / f"data/ppo_steps/round={round_}/part-0.parquet").to_pylist()
        assert steps and all(s["value_loss"] == 0 and s["grad_norm"] > 0 for s in steps)
        model = finished_run / "models" / f"round={round_}"
        assert (model / "trainer_state.json").is_file() and not (model / "value_head.safetensors").exists()
    curves = json.loads((finished_run / "metrics" / "rounds.json").read_text())["rounds"]
    assert sum(c["critiqued"] for c in curves) > 0 and sum(c["critic_requests"] for c in curves) > 0
    assert set(json.loads((finished_run / "metrics" / "eval.json").read_text())) == {"base", "round=0002"}


@pytest.mark.long  # test_e2e_demo's free forced re-run, for grpo
def test_a_forced_rerun_replays_the_critic_for_free_and_reproduces_every_table(finished_run):
    before = table_contents(finished_run)
    dvc(["repro", "--force"], finished_run)
    curves = json.loads((finished_run / "metrics" / "rounds.json").read_text())["rounds"]
    assert [c["critic_requests"] for c in curves] == [0, 0]
    assert table_contents(finished_run) == before


def test_drlc_report_sql_catalog_and_readme_queries_read_a_grpo_run(finished_run, tmp_path, capsys):
    main(["report", str(finished_run), "--out", str(tmp_path / "report")])
    assert "report.md" in capsys.readouterr().out  # the command names what it wrote
    text = (tmp_path / "report" / "report.md").read_text()
    evaluated = json.loads((finished_run / "metrics" / "eval.json").read_text())["round=0002"]["world"]
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines() if line.startswith("| ")]
    rows = {row[0]: row[1] for row in cells}  # metric -> this run's value
    curves = json.loads((finished_run / "metrics" / "rounds.json").read_text())["rounds"]
    assert rows["train/rounds"] == "2"
    assert rows["train/critic_requests_total"] == str(sum(c["critic_requests"] for c in curves))  # 0 after a replay
    assert float(rows["final/world/positive_percent"]) == pytest.approx(evaluated["positive_percent"], rel=1e-3)
    assert (tmp_path / "report" / "curves.png").read_bytes()[:4] == b"\x89PNG"

    con = connect(finished_run / "data")  # the views `drlc sql` and `drlc catalog` open
    groups = con.sql("SELECT round, count(*), count(DISTINCT group_index), max(sample_index), "
                     "count(DISTINCT (group_index, prompt_id)) FROM rollouts GROUP BY round ORDER BY round").fetchall()
    assert groups == [(1, 32, 8, 3, 8), (2, 32, 8, 3, 8)]
    per_group = con.sql("SELECT round, group_index, avg(s.env_reward) FROM rollouts r JOIN scores s "
                        "USING (round, rollout_id) GROUP BY ALL").fetchall()
    assert len(per_group) == 16
    assert con.execute("SELECT count(*), max(abs(value_loss)) FROM ppo_steps").fetchone()[1] == 0
    main(["sql", "SELECT round, count(DISTINCT group_index) AS groups FROM rollouts GROUP BY round ORDER BY round",
          "--data", str(finished_run / "data"), "--format", "csv"])
    assert capsys.readouterr().out.strip().splitlines() == ["round,groups", "1,8", "2,8"]
    main(["catalog", "--data", str(finished_run / "data"), "--out", str(tmp_path / "catalog.sql")])
    assert "CREATE OR REPLACE VIEW rollouts" in (tmp_path / "catalog.sql").read_text()

    readme = {q["key"]: q for q in run_queries(finished_run)["queries"]}
    assert set(readme) == {q.key for q in QUERIES}
    assert [row[0] for row in readme["critic_calls"]["rows"]] == [1, 2]  # one row per round, as for PPO
    assert sum(row[1] for row in readme["critic_calls"]["rows"]) > 0
