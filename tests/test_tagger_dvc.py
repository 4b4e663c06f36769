"""distil -> serve -> critique -> replay through the real DVC: a toxicity run whose critic is a distilled tagger."""
import json
import sys

import pytest
from e2e import dvc, make_project, run, tiny_params

from pipeline.audit.distill import distill
from tests.test_critic_tagger import synthetic

pytestmark = pytest.mark.slow  # runs `dvc repro`


def test_tagger_critic_runs_under_dvc_and_replays_with_no_request(tmp_path):
    distill(synthetic(200), labels=("toxic",), out_dir=tmp_path / "tagger", source="synthetic",
                   max_iter=50, min_count=1)
    params = tiny_params(1, task="toxicity", critic={"backend": "tagger", "model_dir": str(tmp_path / "tagger"),
                                                     "model": "drlc-tagger"})
    project = make_project(tmp_path, params)
    dvc(["repro"], project)
    metrics = json.loads((project / "metrics" / "critique" / "round=0001.json").read_text())
    assert metrics["critiqued"] > 0 and metrics["critic_requests"] == metrics["critiqued"]
    assert metrics["critic_error_rate"] == 0.0
    query = "SELECT critic_model, count(*) AS n FROM annotations WHERE critiqued GROUP BY 1"
    annotations = run([sys.executable, "-m", "pipeline", "sql", "--format", "csv", query], project).stdout
    assert "drlc-tagger" in annotations
    run([sys.executable, "-m", "pipeline", "replay", "--from", ".", "--out", "replays/r", "--dvc",
         "--set", "ppo.learning_rate=0.002"], project)
    dvc(["repro", "replays/r/dvc.yaml"], project)
    assert json.loads((project / "replays" / "r" / "replay.json").read_text())["critic_requests"] == 0
    dvc(["repro", "-f", "--single-item", "critique@0001"], project)
    again = json.loads((project / "metrics" / "critique" / "round=0001.json").read_text())
    assert again["critic_requests"] == 0 and again["cache_hits"] == metrics["critiqued"]
