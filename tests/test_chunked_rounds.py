"""Chunked rounds through the real DVC: the demo DAG with 4 rounds run as per-round stages (K = 1), as
two chunk stages of 2 (K = 2) and as one chunk stage of 4 (K = 4) gives the same tables row by row,
the same metrics JSON and the same final checkpoint; a chunk killed before its end re-runs alone,
to the same tables.

Shrunk beyond tests/e2e.py's tiny_params so three 4-round runs fit (rollout.batch_size 16, base.steps
200, 4 evaluation prompts): one process start per stage dominates, so K = 1 is the slow run.

The same for groups: configs/demo-grpo.yaml (GRPO, 4 responses to each of 4 prompts a round, no value head)
over 2 rounds as per-round stages and as one chunk of 2 gives the same tables, metrics and checkpoint.
"""
import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
import yaml
from e2e import dump_params, dvc, make_project, tiny_params
from safetensors.torch import load_file

from pipeline.commands.rounds import chunk_chain
from pipeline.core.store import VOLATILE_COLUMNS, round_partition

pytestmark = pytest.mark.slow  # three 4-round `dvc repro` runs

N_ROUNDS = 4  # 8 rounds took 2x the suite time and tested nothing two chunks of 2 do not
GROUPED_ROUNDS = 2  # the demo-grpo runs: one chunk of both rounds
ROUND_TABLES = ["rollouts", "scores", "annotations", "ppo_steps", "kl_rewards"]
CHECKPOINT_FILES = ["model.safetensors", "value_head.safetensors"]


def chunked_params(per_stage: int, n_rounds: int = N_ROUNDS, profile: str | None = None) -> dict:
    raw = tiny_params(n_rounds=n_rounds, profile=profile)
    raw["base"].update(steps=200)
    raw["rollout"].update(batch_size=16, generation_batch_size=16)
    raw["evaluate"].update(n_prompts=4, samples_per_prompt=2)
    raw["run"]["rounds_per_stage"] = per_stage
    raw["chunks"] = chunk_chain(n_rounds, per_stage) if per_stage > 1 else {}
    if per_stage > 1:
        raw["rounds"] = {}
    return raw


def finished_projects(tmp_path_factory, per_stages: tuple[int, ...], n_rounds: int = N_ROUNDS,
                      profile: str | None = None) -> dict[int, Path]:
    """{K: a finished project} for K = 1 and each of per_stages; the base model is built once and copied."""
    name = profile or "demo"
    first = make_project(tmp_path_factory.mktemp(f"{name}-k1"), chunked_params(1, n_rounds, profile))
    dvc(["repro", "base"], first)
    projects = {1: first}
    for per_stage in per_stages:
        copy = tmp_path_factory.mktemp(f"{name}-k{per_stage}") / "project"
        shutil.copytree(first, copy, symlinks=True)
        (copy / "params.yaml").write_text(dump_params(chunked_params(per_stage, n_rounds, profile)))
        projects[per_stage] = copy
    for project in projects.values():
        dvc(["repro"], project)
    return projects


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[int, Path]:
    return finished_projects(tmp_path_factory, (2, 4))


@pytest.fixture(scope="module")
def grouped_runs(tmp_path_factory) -> dict[int, Path]:
    return finished_projects(tmp_path_factory, (GROUPED_ROUNDS,), GROUPED_ROUNDS, profile="demo-grpo")


def round_tables(project: Path, n_rounds: int = N_ROUNDS) -> dict[tuple[str, int], list[dict]]:
    """{(table, round): rows minus the volatile columns}, found in either layout."""
    contents = {}
    for table in ROUND_TABLES:
        for round_ in range(1, n_rounds + 1):
            parquet = pq.read_table(round_partition(project / "data", table, round_) / "part-0.parquet")
            contents[table, round_] = parquet.drop(VOLATILE_COLUMNS.get(table, [])).to_pylist()
    return contents


def round_metrics(project: Path, per_stage: int, n_rounds: int = N_ROUNDS) -> dict[tuple[str, int], dict]:
    """{(critique|ppo, round): the round's metrics JSON}, from metrics/<kind>/[chunk=KKKK/]round=NNNN.json."""
    folder = {r: f"chunk={key}/" for key, c in chunk_chain(n_rounds, per_stage).items()
              for r in range(int(key), int(c["last"]) + 1)} if per_stage > 1 else {}
    return {(kind, r): json.loads((project / "metrics" / kind / f"{folder.get(r, '')}round={r:04d}.json").read_text())
            for kind in ("critique", "ppo") for r in range(1, n_rounds + 1)}


def test_chunks_write_their_rounds_in_chunk_folders(runs):
    folders = sorted(p.name for p in (runs[2] / "data" / "rollouts").iterdir() if p.is_dir())
    assert folders == ["chunk=0001", "chunk=0003"]
    assert (runs[2] / "data" / "scores" / "chunk=0003" / "round=0004" / "part-0.parquet").is_file()
    assert not list((runs[2] / "data" / "rollouts").glob("round=*"))
    assert not (runs[2] / "models" / "round=0001").exists()  # one checkpoint per chunk
    assert (runs[2] / "models" / "round=0002").is_dir() and (runs[4] / "models" / "round=0004").is_dir()


@pytest.mark.parametrize("per_stage", [2, 4])
def test_chunked_tables_equal_the_per_round_ones(runs, per_stage):
    expected, got = round_tables(runs[1]), round_tables(runs[per_stage])
    assert all(len(rows) > 0 for rows in expected.values())
    for key in expected:
        assert got[key] == expected[key], key


@pytest.mark.parametrize("per_stage", [2, 4])
def test_chunked_metrics_and_checkpoint_equal_the_per_round_ones(runs, per_stage):
    assert round_metrics(runs[per_stage], per_stage) == round_metrics(runs[1], 1)
    for name in ("rounds.json", "eval.json"):
        assert (runs[per_stage] / "metrics" / name).read_text() == (runs[1] / "metrics" / name).read_text(), name
    last = f"models/round={N_ROUNDS:04d}"
    for name in CHECKPOINT_FILES:
        expected, got = load_file(runs[1] / last / name), load_file(runs[per_stage] / last / name)
        assert set(got) == set(expected) and all(torch.equal(got[k], expected[k]) for k in expected), name
    expected = torch.load(runs[1] / last / "optimizer.pt", weights_only=True)["state"]
    got = torch.load(runs[per_stage] / last / "optimizer.pt", weights_only=True)["state"]
    assert all(torch.equal(got[i][k], expected[i][k]) for i in expected for k in expected[i])
    trainer_state = json.loads((runs[per_stage] / last / "trainer_state.json").read_text())
    assert trainer_state == json.loads((runs[1] / last / "trainer_state.json").read_text())
    assert trainer_state["round"] == N_ROUNDS


def test_a_chunk_killed_before_its_end_reruns_alone_to_the_same_tables(runs):
    """The state a chunk killed during its first run leaves: no outputs, no dvc.lock entry (DVC writes it
    when a stage ends) and no run-cache entry (--no-run-cache). Deleted outputs of a chunk that did
    finish come back from DVC's cache instead ("is cached - skipping run")."""
    project = runs[2]
    for table in ROUND_TABLES:
        shutil.rmtree(project / "data" / table / "chunk=0003")
    shutil.rmtree(project / "metrics" / "ppo" / "chunk=0003")
    shutil.rmtree(project / "models" / f"round={N_ROUNDS:04d}")
    lock = yaml.safe_load((project / "dvc.lock").read_text())
    del lock["stages"]["chunk@0003"]
    (project / "dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False))
    again = dvc(["repro", "--no-run-cache"], project).stdout
    assert "Running stage 'chunk@0003'" in again and "Running stage 'chunk@0001'" not in again, again
    got, expected = round_tables(project), round_tables(runs[1])
    differ = [key for key in expected if got[key] != expected[key]]
    assert not differ, (differ, first_difference(got[differ[0]], expected[differ[0]]))


def first_difference(got: list[dict], expected: list[dict]) -> str:
    """The first differing row and columns of two tables, for a failure message."""
    if len(got) != len(expected):
        return f"{len(got)} rows, expected {len(expected)}"
    for i, (a, b) in enumerate(zip(got, expected)):
        if a != b:
            return f"row {i}: " + "; ".join(f"{k}: {a.get(k)!r} != {b.get(k)!r}" for k in b if a.get(k) != b[k])
    return "equal"


@pytest.mark.long  # the grouped twin of the chunk tests above
def test_a_grouped_grpo_chunk_equals_its_per_round_stages(grouped_runs):
    """demo-grpo (groups of 4, no value head): one chunk of 2 rounds writes the tables, metrics and checkpoint
    of 2 per-round stage sets."""
    per_round, chunked = grouped_runs[1], grouped_runs[GROUPED_ROUNDS]
    expected = round_tables(per_round, GROUPED_ROUNDS)
    for round_ in range(1, GROUPED_ROUNDS + 1):
        rollouts = expected["rollouts", round_]
        assert [r["sample_index"] for r in rollouts] == [i % 4 for i in range(16)]
        assert all(len({r["prompt_id"] for r in rollouts[g : g + 4]}) == 1 for g in range(0, 16, 4))
        assert expected["ppo_steps", round_] and all(s["value_loss"] == 0 for s in expected["ppo_steps", round_])
    assert round_tables(chunked, GROUPED_ROUNDS) == expected
    assert round_metrics(chunked, GROUPED_ROUNDS, GROUPED_ROUNDS) == round_metrics(per_round, 1, GROUPED_ROUNDS)
    last = f"models/round={GROUPED_ROUNDS:04d}"
    assert not (per_round / last / "value_head.safetensors").exists()
    assert not (chunked / last / "value_head.safetensors").exists()
    expected, got = load_file(per_round / last / "model.safetensors"), load_file(chunked / last / "model.safetensors")
    assert set(got) == set(expected) and all(torch.equal(got[k], expected[k]) for k in expected)
    for name in ("rounds.json", "eval.json"):
        assert (chunked / "metrics" / name).read_text() == (per_round / "metrics" / name).read_text(), name
