"""Chunked rounds without training: the `chunks` section and its checks, `drlc rounds N --per-stage K`,
the stage list DVC and `drlc estimate` see, and the readers of both table layouts (real DuckDB)."""
import re
import shutil
from pathlib import Path

import inprocess
import pytest
from test_rounds import dvc_project, dvc_stdout, stage_names

from pipeline.commands.estimate import measured_critique_rate, planned_stages
from pipeline.commands.rounds import chunk_chain, set_rounds
from pipeline.core import store
from pipeline.core.config import load_params, params_from_dict, read_yaml
from pipeline.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def chunked_raw(n_rounds: int = 10, per_stage: int = 4) -> dict:
    raw = read_yaml((ROOT / "params.yaml").read_text())
    raw["run"]["rounds_per_stage"] = per_stage
    raw["rounds"], raw["chunks"] = {}, chunk_chain(n_rounds, per_stage)
    raw["evaluate"]["policy"] = f"round={n_rounds:04d}"
    return raw


def test_chunks_expand_to_every_round_with_its_prev():
    params = params_from_dict(chunked_raw(10, 4))
    assert params.round_keys() == [f"{r:04d}" for r in range(1, 11)]
    assert [params.rounds[k].prev for k in ("0001", "0002", "0005", "0010")] == \
           ["base", "round=0001", "round=0004", "round=0009"]
    assert sorted(params.chunks) == ["0001", "0005", "0009"]
    assert params.chunk_rounds("0009") == ["0009", "0010"] and params.chunks["0005"].prev == "round=0004"


def _broken(edit) -> dict:
    raw = chunked_raw(10, 4)
    edit(raw)
    return raw


@pytest.mark.parametrize("edit, message", [
    (lambda r: r["chunks"]["0005"].update(prev="round=0003"),
     r"chunk '0005' \(prev 'round=0003'\) breaks the chain: expected chunk '0005' with prev 'round=0004'"),
    (lambda r: r["chunks"].update({"0006": r["chunks"].pop("0005")}), "chunk '0006' .* expected chunk '0005'"),
    (lambda r: r["chunks"]["0001"].update(prev="round=0000"), "chunk '0001' .* with prev 'base'"),
    (lambda r: r["run"].update(rounds_per_stage=5), r"chunk '0001' runs 4 rounds \(0001..0004\) but "
                                                    r"'run.rounds_per_stage' = 5 \(only the last chunk may be shorter\)"),
    (lambda r: r["chunks"].update({"0001": {"prev": "base", "last": "0003"}}), "chunk '0001' runs 3 rounds"),
    (lambda r: r["chunks"]["0009"].update(last="0013"), "chunk '0009' runs 5 rounds"),
    (lambda r: r["evaluate"].update(policy="round=0008"), "'evaluate.policy' = 'round=0008' must name the last "
                                                           "round: 'round=0010'"),
    (lambda r: r.update(rounds={"0001": {"prev": "base"}}), "'rounds' lists 1 per-round stages but "
                                                             "'run.rounds_per_stage' = 4"),
    (lambda r: r.update(chunks={}), "'run.rounds_per_stage' = 4 needs 'chunks'"),
    (lambda r: r["chunks"]["0001"].update(last=4), r"'chunks.0001.last' = 4 has the wrong type"),
    (lambda r: r["chunks"]["0001"].update(first="0001"), r"Unknown key 'chunks.0001.first'"),
])
def test_bad_chunks_fail_with_one_line_naming_the_fix(edit, message):
    with pytest.raises(ConfigError, match=message) as error:
        params_from_dict(_broken(edit))
    assert "\n" not in str(error.value)


def test_chunks_with_one_round_per_stage_are_refused():
    raw = read_yaml((ROOT / "params.yaml").read_text())
    raw["chunks"] = chunk_chain(4, 2)
    with pytest.raises(ConfigError, match="'chunks' is set but 'run.rounds_per_stage' = 1"):
        params_from_dict(raw)


@pytest.fixture
def params_file(tmp_path):
    return Path(shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml"))


def drlc(*args: str, cwd: Path) -> str:
    done = inprocess.drlc(list(args), cwd)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_drlc_rounds_per_stage_writes_chunks_and_back(params_file):
    original = params_file.read_text()
    out = drlc("rounds", "10", "--per-stage", "4", "--params", str(params_file), cwd=ROOT)
    assert out.strip() == f"{params_file}: 10 rounds (0001..0010), 3 chunk stages of 4, evaluate.policy = round=0010"
    text = params_file.read_text()
    assert re.search(r"^rounds: \{\}$", text, flags=re.M) and "  rounds_per_stage: 4 " in text
    lines = text.splitlines()
    chunks = lines.index("chunks:")
    assert lines[chunks + 1:chunks + 4] == ['  "0001": {prev: base, last: "0004"}',
                                      '  "0005": {prev: round=0004, last: "0008"}',
                                      '  "0009": {prev: round=0008, last: "0010"}']
    params = load_params(params_file)
    assert params.round_keys()[-1] == "0010" and params.evaluate.policy == "round=0010"
    set_rounds(params_file, 4)
    assert params_file.read_text() == original  # per-round again: byte for byte the file it was


def test_drlc_rounds_per_stage_exp_prints_dvc_flags():
    out = drlc("rounds", "5", "--per-stage", "2", "--exp", cwd=ROOT)
    assert out.strip() == ('dvc exp run -S "~rounds" -S "+rounds={}" -S "~chunks" -S "+chunks={0001: {prev: base, '
                           "last: '0002'}, 0003: {prev: 'round=0002', last: '0004'}, 0005: {prev: 'round=0004', "
                           "last: '0005'}}\" -S \"run.rounds_per_stage=2\" -S \"evaluate.policy='round=0005'\"")


def test_bad_per_stage_is_refused(params_file):
    before = params_file.read_text()
    with pytest.raises(ConfigError, match="--per-stage 0: give a whole number of rounds per stage >= 1"):
        set_rounds(params_file, 4, 0)
    assert params_file.read_text() == before


def test_planned_stages_expand_the_chunk_stage_over_chunks():
    chunked = params_from_dict(chunked_raw(10, 4))
    assert planned_stages(chunked, ROOT / "dvc.yaml") == ["prepare", "base", "chunk@0001", "chunk@0005", "chunk@0009",
                                                          "evaluate"]
    per_round = load_params(ROOT / "params.yaml")
    stages = planned_stages(per_round, ROOT / "dvc.yaml")
    assert "ppo@0004" in stages and not any(s.startswith("chunk@") for s in stages) and len(stages) == 2 + 4 * 4 + 1


def test_dvc_lists_the_chunk_stages(tmp_path, monkeypatch):
    project = dvc_project(tmp_path)
    drlc("rounds", "6", "--per-stage", "4", cwd=project)
    names = stage_names(dvc_stdout(["status"], project, monkeypatch))
    assert {"chunk@0001", "chunk@0005", "evaluate"} <= names and not any(n.startswith("rollout@") for n in names)


def _rows(table: str, round_: int, rewards: list[float]) -> list[dict]:
    return [{"run_id": "t", "round": round_, "rollout_id": f"r{round_}-{i}", "env_reward": reward,
             "env_reward_shaped": reward, "scorer": "s", "scorer_version": "1"} for i, reward in enumerate(rewards)]


def test_readers_see_both_layouts(tmp_path):
    data = tmp_path / "data"
    store.write_table(_rows("scores", 1, [0.5, -1.0]), "scores", store.partition_dir(data, "scores", 1))
    store.write_table(_rows("scores", 2, [-0.5]), "scores", store.chunk_dir(data, "scores", "0002") / "round=0002")
    store.write_table(_rows("scores", 3, [1.0]), "scores", store.chunk_dir(data, "scores", "0002") / "round=0003")
    assert store.round_partition(data, "scores", 3) == data / "scores" / "chunk=0002" / "round=0003"
    assert store.round_partition(data, "scores", 1) == data / "scores" / "round=0001"
    assert [f.parent.name for f in store.partition_files(data, "scores")] == ["round=0001", "round=0002", "round=0003"]
    con = store.connect(data)
    assert con.sql("SELECT round, count(*) FROM scores GROUP BY round ORDER BY round").fetchall() == \
           [(1, 2), (2, 1), (3, 1)]
    params = load_params(ROOT / "params.yaml")  # critic.threshold 0.0: rewards <= 0 are critiqued
    assert measured_critique_rate(params, data) == 2 / 4
    only_chunks = tmp_path / "chunked"
    shutil.copytree(data / "scores" / "chunk=0002", only_chunks / "scores" / "chunk=0002")
    assert store.connect(only_chunks).sql("SELECT count(*) FROM scores").fetchall() == [(2,)]


def test_replay_reads_the_rounds_of_a_chunked_run(tmp_path):
    from pipeline.commands.replay import raw_params, read_inputs

    params = params_from_dict(chunked_raw(3, 2))
    (tmp_path / "models" / "base").mkdir(parents=True)
    for round_, chunk in ((1, "0001"), (2, "0001"), (3, "0003")):
        rollout = {"run_id": "t", "round": round_, "rollout_id": f"r{round_}", "prompt_id": "p", "query": "q",
                   "response": "a", "query_ids": [1], "response_ids": [2], "behaviour_logprobs": [-0.5], "seed": 0,
                   "max_new_tokens": 1, "policy": "base"}
        folder = f"round={round_:04d}"
        store.write_table([rollout], "rollouts", store.chunk_dir(tmp_path / "data", "rollouts", chunk) / folder)
        store.write_table(_rows("scores", round_, [0.1]), "scores",
                          store.chunk_dir(tmp_path / "data", "scores", chunk) / folder)
    inputs = read_inputs(tmp_path, params, allow_new_calls=True)
    assert {key: tables["rollouts"][0]["rollout_id"] for key, tables in inputs.items()} == \
           {"0001": "r1", "0002": "r2", "0003": "r3"}
    assert params_from_dict(raw_params(params)) == params  # the replay's params.yaml loads back as chunked
