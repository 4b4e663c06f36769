"""The switch-over's pieces without DVC: which critic critiques which round, which rounds each side runs,
and the tagger's examples read from the critic side's folders only (tests/test_switch_dvc.py runs it all)."""
import dataclasses

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from e2e import ROOT

from pipeline.audit.distill import examples_from_folders
from pipeline.core.config import params_from_dict
from pipeline.core.errors import ConfigError, DataError
from pipeline.steps.preflight import check_inputs
from pipeline.steps.switch import round_critic, side_params, side_rounds, tagger_critic

SPAN = pa.struct([("label", pa.string()), ("start", pa.int32()), ("end", pa.int32())])


def switched_params(r: str = "0002", last: str = "0004"):
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw.update(rounds={}, switch={r: {"last": last}})
    raw["evaluate"]["policy"] = f"round={last}"
    return params_from_dict(raw)


def test_rounds_up_to_r_keep_the_configured_critic_and_later_ones_get_the_tagger():
    params = switched_params()
    assert side_rounds(params, "critic") == ["0001", "0002"] and side_rounds(params, "tagger") == ["0003", "0004"]
    assert round_critic(params, "0002") is params.critic
    later = round_critic(params, "0003", "runs/x/models")
    assert (later.endpoint, later.backend, later.model_dir, later.model) == (
        "local", "tagger", "runs/x/models/tagger=0002", "drlc-tagger")
    kept = {f.name for f in dataclasses.fields(later)} - {"endpoint", "backend", "model_dir", "model"}
    assert all(getattr(later, name) == getattr(params.critic, name) for name in kept)
    assert tagger_critic(params.critic, "m").rewards == params.critic.rewards
    with pytest.raises(ConfigError, match="--side 'both'"):
        side_rounds(params, "both")
    unswitched = params_from_dict(yaml.safe_load((ROOT / "params.yaml").read_text()))
    assert round_critic(unswitched, "0004") is unswitched.critic
    with pytest.raises(ConfigError, match="'switch' is {}"):
        side_rounds(unswitched, "critic")


def test_the_tagger_side_checks_its_own_critic_so_a_paid_api_key_is_not_needed(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    params = switched_params()
    paid = dataclasses.replace(params, critic=dataclasses.replace(params.critic, endpoint="https://api.openai.com/v1",
                                                                  model="gpt-4o-mini"))
    with pytest.raises(Exception, match="OPENAI_API_KEY"):
        check_inputs(side_params(paid, "critic", None))
    tagger_side = side_params(paid, "tagger", "models/tagger=0002")
    assert check_inputs(tagger_side).critic.endpoint == "local"
    with pytest.raises(ConfigError, match="--tagger DIR is given to the tagger side"):
        side_params(paid, "critic", "models/tagger=0002")


def write_part(folder, rows: dict) -> None:
    folder.mkdir(parents=True)
    pq.write_table(pa.table(rows), folder / "part-0.parquet")


def test_the_tagger_reads_the_read_answers_of_the_critic_side_only(tmp_path):
    data = tmp_path / "data"
    for r, texts in ((1, ["good film", "dull plot", "meh"]), (2, ["great cast"])):
        write_part(data / "rollouts" / "chunk=critic" / f"round={r:04d}",
                   {"round": [r] * len(texts), "rollout_id": list(range(len(texts))), "response": texts})
    write_part(data / "annotations" / "chunk=critic" / "round=0001", {
        "round": [1, 1, 1], "rollout_id": [0, 1, 2], "status": ["ok", "ok", "parse_error"],
        "spans": pa.array([[{"label": "positive", "start": 0, "end": 4}],
                           [{"label": "negative", "start": 0, "end": 4}, {"label": "negative", "start": -1, "end": -1}],
                           []], type=pa.list_(SPAN))})
    write_part(data / "annotations" / "chunk=critic" / "round=0002", {
        "round": [2], "rollout_id": [0], "status": ["none"], "spans": pa.array([[]], type=pa.list_(SPAN))})
    write_part(data / "annotations" / "chunk=tagger" / "round=0003", {  # the later side: never read
        "round": [3], "rollout_id": [0], "status": ["ok"],
        "spans": pa.array([[{"label": "positive", "start": 0, "end": 1}]], type=pa.list_(SPAN))})
    examples = examples_from_folders(data / "rollouts/chunk=critic", data / "annotations/chunk=critic",
                                     labels=("positive", "negative"))
    assert examples == [("good film", (("positive", 0, 4),)), ("dull plot", (("negative", 0, 4),)), ("great cast", ())]
    with pytest.raises(DataError, match="'.*chunk=nothing' holds no annotations partition"):
        examples_from_folders(data / "rollouts/chunk=critic", data / "annotations/chunk=nothing", labels=("positive",))
    with pytest.raises(DataError, match="span label 'negative' is not a template label"):
        examples_from_folders(data / "rollouts/chunk=critic", data / "annotations/chunk=critic", labels=("positive",))
