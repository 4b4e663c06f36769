"""configs/demo-grpo.yaml end to end with `dvc repro`: GRPO with the critic's tokens, groups of 4, no value head.

Shrunk as the PPO demo's test (tests/e2e.py tiny_params): 2 rounds of 32 responses = 8 prompts x 4. A forced
re-run replays the critic from its cache (0 requests) and reproduces every table.
"""
import json

import pyarrow.parquet as pq
import pytest
from e2e import dvc, make_project, tiny_params
from test_e2e_demo import table_contents

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


def test_a_forced_rerun_replays_the_critic_for_free_and_reproduces_every_table(finished_run):
    before = table_contents(finished_run)
    dvc(["repro", "--force"], finished_run)
    curves = json.loads((finished_run / "metrics" / "rounds.json").read_text())["rounds"]
    assert [c["critic_requests"] for c in curves] == [0, 0]
    assert table_contents(finished_run) == before
