"""The switch-over through the real DVC: the demo's lexicon critic on rounds 1..2, a tagger distilled from
their answers on round 3, then a forced re-run and a replay that send no critic request.

Shrunk demo (tests/e2e.py tiny_params: 32 rollouts a round, a 400-step base model), every response
critiqued (critic.threshold 1.0 >= VADER's maximum) so the tagger trains on 64 answers.
"""
import json
import sys

import pytest
import yaml
from e2e import dump_params, dvc, make_project, run, tiny_params

from pipeline.audit.distill import data_sha256, examples_from_folders
from pipeline.core import store

pytestmark = pytest.mark.slow  # runs `dvc repro`

TABLES = ("rollouts", "scores", "annotations", "ppo_steps")


def switch_params() -> dict:
    params = tiny_params(3, critic={"threshold": 1.0})
    params["rounds"] = {}
    params["switch"] = {"0002": {"last": "0003", "seed": 0, "heldout_share": 0.25}}
    return params


def critique_metrics(project, side: str, key: str) -> dict:
    return json.loads((project / "metrics" / "critique" / f"chunk={side}" / f"round={key}.json").read_text())


def lock_deps(lock: dict, stage: str) -> dict[str, str]:
    return {d["path"]: d.get("md5") for d in lock[stage]["deps"]}


def tables(project) -> dict:
    """Every table's rows by round, without the columns that measure the cache or the machine."""
    found = {}
    for table in TABLES:
        for part in store.partition_files(project / "data", table):
            volatile = store.VOLATILE_COLUMNS.get(table, [])
            found[(table, part.parent.name)] = [{k: v for k, v in row.items() if k not in volatile}
                                                for row in store.read_table(part)]
    return found


def test_the_tagger_of_rounds_1_2_critiques_round_3_and_reruns_send_nothing(tmp_path):
    project = make_project(tmp_path, switch_params())
    dvc(["repro"], project)

    # rounds 1..2: the lexicon through drlc's server; round 3: the tagger, through the same server and client
    # (a response sampled twice is asked once: a cache hit, or neither a request nor a hit in the same batch)
    first = {(side, key): critique_metrics(project, side, key)
             for side, key in (("critic", "0001"), ("critic", "0002"), ("tagger", "0003"))}
    for m in first.values():
        assert m["critiqued"] == 32 >= m["critic_requests"] + m["cache_hits"] and m["critic_requests"] > 16
        assert m["critic_error_rate"] == 0.0
    assert first["tagger", "0003"]["critic_cost_usd"] == 0.0
    query = "SELECT round, critic_model, count(*) AS n FROM annotations WHERE critiqued GROUP BY ALL ORDER BY 1"
    rows = run([sys.executable, "-m", "pipeline", "sql", "--format", "csv", query], project).stdout.split()
    assert rows[1:] == ["1,drlc-lexicon,32", "2,drlc-lexicon,32", "3,drlc-tagger,32"]

    # the card: trained on exactly rounds 1..2's read answers
    card = json.loads((project / "models" / "tagger=0002" / "card.json").read_text())
    examples = examples_from_folders(project / "data/rollouts/chunk=critic", project / "data/annotations/chunk=critic",
                                     labels=("positive", "negative"))
    read = [row for r in ("0001", "0002") for row in store.read_table(
        project / "data/annotations/chunk=critic" / f"round={r}") if row["status"] in ("ok", "none")]
    assert card["n_examples"] == len(examples) == len(read) > 48 and card["data_sha256"] == data_sha256(examples)
    assert card["labels"] == ["positive", "negative"] and card["n_heldout"] == round(0.25 * len(read))

    # the lineage: critic side -> tagger -> tagger side; the critic side depends on no tagger
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    distilled = lock_deps(lock, "switch_distill@0002")
    assert {"data/rollouts/chunk=critic", "data/annotations/chunk=critic"} <= set(distilled)
    (tagger_out,) = lock["switch_distill@0002"]["outs"]
    tagger_md5 = tagger_out["md5"]
    assert tagger_out["path"] == "models/tagger=0002"
    assert lock_deps(lock, "switch_tagger@0002")["models/tagger=0002"] == tagger_md5
    assert not any("tagger" in path for path in lock_deps(lock, "switch_critic@0002"))
    critic_outs = {o["path"]: o["md5"] for o in lock["switch_critic@0002"]["outs"]}
    assert critic_outs["data/annotations/chunk=critic"] == distilled["data/annotations/chunk=critic"]

    # a forced re-run of the three stages: every answer from the cache, the same tables and tagger
    before = tables(project)
    dvc(["repro", "-f", "--single-item", "switch_critic@0002", "switch_distill@0002", "switch_tagger@0002"], project)
    for (side, key), m in first.items():
        again = critique_metrics(project, side, key)
        assert again["critic_requests"] == 0 and again["cache_hits"] == m["critic_requests"] + m["cache_hits"]
    assert tables(project) == before
    assert yaml.safe_load((project / "dvc.lock").read_text())["stages"]["switch_distill@0002"]["outs"][0]["md5"] \
        == tagger_md5

    # a replay reads rounds 1..2 with the lexicon's answers and round 3 with the tagger's: no request
    run([sys.executable, "-m", "pipeline", "replay", "--from", ".", "--out", "replays/r", "--no-evaluate",
         "--set", "ppo.learning_rate=0.002"], project)
    assert json.loads((project / "replays" / "r" / "replay.json").read_text())["critic_requests"] == 0

    # a new tagger seed re-runs the tagger and its side, never rounds 1..2
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["switch"]["0002"]["seed"] = 1
    (project / "params.yaml").write_text(dump_params(params))
    changed = set(json.loads(dvc(["status", "--json"], project).stdout or "{}"))
    assert {"switch_distill@0002", "switch_tagger@0002"} <= changed and "switch_critic@0002" not in changed
