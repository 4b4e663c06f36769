"""configs/smol-detox-tagger.yaml, shortened, through the real DVC on the real data: the `distill@semeval`
stage trains the tagger critic on SemEval spans, and dvc.lock carries its lineage to the critique.

Kept from the profile: real RealToxicityPrompts prompts above toxicity 0.6, the fitted toxicity reward,
a GGUF base.model converted by the base stage, LoRA, the tagger critic served by drlc's local server
from the model folder the distill stage writes. Shortened: the first 400 posts of tsd_train.csv (the
profile trains on all 7,939), a tiny Llama GGUF in place of the 93 MB SmolLM2 file (tests/tiny_gguf.py),
1 round x 8 rollouts.
"""
from __future__ import annotations

import csv
import json

import pytest
import yaml
from e2e import ROOT, dvc, make_project

from pipeline.audit.distill import data_sha256, examples_from_file

pytestmark = [pytest.mark.slow, pytest.mark.long]  # dvc repro of a SmolLM2 profile (test_tagger_dvc: the default tier)
pytest.importorskip("gguf", reason="the smol extra is not installed: pip install -c constraints.txt -e '.[smol]'")
SHARED_DATA = ROOT.parent / "shared" / "data"
TSD_TRAIN = SHARED_DATA / "toxicity" / "semeval2021_toxic_spans" / "tsd_train.csv"
if not TSD_TRAIN.is_file():
    pytest.skip(f"the real data is not at {SHARED_DATA} (CI clones the repo next to shared/)", allow_module_level=True)

from tiny_gguf import write_tiny_gguf


def shared(path: str) -> str:
    assert path.startswith("../shared/data/")  # relative to the repo root, as CI lays it out
    return str(SHARED_DATA / path.removeprefix("../shared/data/"))


def write_posts(path, n: int) -> None:
    """The first n posts of tsd_train.csv, as a SemEval CSV."""
    with open(TSD_TRAIN, newline="", encoding="utf-8") as src, open(path, "w", newline="", encoding="utf-8") as out:
        rows = csv.reader(src)
        writer = csv.writer(out)
        for i, row in enumerate(rows):
            if i > n:
                break
            writer.writerow(row)


def tagger_params(spans: str) -> dict:
    raw = yaml.safe_load((ROOT / "configs" / "smol-detox-tagger.yaml").read_text())
    assert raw["critic"]["backend"] == "tagger" and raw["critic"]["model_dir"] == "critics/semeval"
    assert raw["distill"]["semeval"]["spans"] == "../shared/data/toxicity/semeval2021_toxic_spans/tsd_train.csv"
    raw["distill"]["semeval"]["spans"] = spans
    raw["world"].update(source=shared(raw["world"]["source"]), n_train_prompts=16, n_eval_prompts=2)
    raw["score"]["train_data"] = shared(raw["score"]["train_data"])
    raw["base"]["model"] = "tiny-smol.gguf"
    raw["rollout"].update(batch_size=8, generation_batch_size=8, max_new_tokens=6)
    raw["critic"]["threshold"] = 1.0  # every response is critiqued (rewards are <= 1)
    raw["ppo"].update(mini_batch_size=8)
    raw["evaluate"].update(policy="round=0001", n_prompts=2, samples_per_prompt=2, max_new_tokens=6, batch_size=8)
    raw["rounds"] = {"0001": {"prev": "base"}}
    return raw


def changed_stages(project) -> set[str]:
    status = json.loads(dvc(["status", "--json"], project).stdout or "{}")
    return set(status)


def test_the_distill_stage_trains_the_critic_and_the_lock_shows_its_lineage(tmp_path):
    project = make_project(tmp_path, {})
    write_tiny_gguf(project / "tiny-smol.gguf", crafted=True)
    write_posts(project / "tsd_head.csv", 400)
    (project / "params.yaml").write_text(yaml.safe_dump(tagger_params("tsd_head.csv"), sort_keys=False))
    dvc(["repro"], project)

    card = json.loads((project / "critics/semeval/card.json").read_text())
    examples = examples_from_file(project / "tsd_head.csv", labels=("toxic",))
    assert card["n_examples"] == 400 and card["data_sha256"] == data_sha256(examples)
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    distilled = lock["distill@semeval"]
    assert [d["path"] for d in distilled["deps"] if d["path"].endswith(".csv")] == ["tsd_head.csv"]
    assert [o["path"] for o in distilled["outs"]] == ["critics/semeval"]
    critics_dep = [d for d in lock["critique@0001"]["deps"] if d["path"] == "critics"]
    assert len(critics_dep) == 1 and critics_dep[0]["nfiles"] >= 3  # README + the tagger's files

    metrics = json.loads((project / "metrics/critique/round=0001.json").read_text())
    assert metrics["critiqued"] == 8 and metrics["critic_requests"] == 8 and metrics["critic_error_rate"] == 0.0
    assert changed_stages(project) == set()

    write_posts(project / "tsd_head.csv", 300)  # other training data: a new tagger, so a new critique
    assert changed_stages(project) == {"distill@semeval"}
    dvc(["repro", "distill@semeval"], project)
    assert "critique@0001" in changed_stages(project)  # critics/ changed under it
    again = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    assert again["distill@semeval"]["outs"][0]["md5"] != distilled["outs"][0]["md5"]
