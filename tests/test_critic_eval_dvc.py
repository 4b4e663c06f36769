"""The audit as a DVC stage (`drlc critic eval --dvc`), with the real DVC on a tiny toxicity demo.

Slow (about a minute): it runs the demo DAG once so that `dvc repro` can be shown to skip every
demo stage and never run the audit.
"""
import json
import sys

import pytest
import yaml
from e2e import dvc, make_project, run, tiny_params

from pipeline.commands.cli import main


@pytest.mark.slow
def test_audit_stage_runs_is_cached_and_leaves_the_demo_alone(tmp_path):
    project = make_project(tmp_path, tiny_params(n_rounds=1, task="toxicity", base={"steps": 50},
                                                 world={"n_reviews": 1000}))
    dvc(["repro"], project)
    (project / "posts.jsonl").write_text(json.dumps(
        {"text": "you idiot", "spans": [{"start": 4, "end": 9, "label": "toxic"}]}) + "\n")
    wrote = run([sys.executable, "-m", "pipeline", "critic", "eval", "--spans", "posts.jsonl", "--name", "t",
                 "--dvc", "audit"], project)
    assert "dvc repro audit/dvc.yaml" in wrote.stdout
    stage = yaml.safe_load((project / "audit" / "dvc.yaml").read_text())["stages"]["critic_eval"]
    code = {"pipeline/audit/critic_eval.py", "pipeline/critic/client.py"}  # from the audit's import closure
    assert stage["wdir"] == ".." and {"posts.jsonl", "prompts/toxicity.md"} | code <= set(stage["deps"])

    demo = dvc(["repro"], project).stdout  # the project's own dvc.yaml: nothing to do, no audit
    assert "Running stage" not in demo and "didn't change" in demo
    assert not (project / "data" / "critic_eval").exists()

    first = dvc(["repro", "audit/dvc.yaml"], project).stdout
    assert "Running stage 'audit/dvc.yaml:critic_eval'" in first and "1 requests sent" in first
    summary = json.loads((project / "reports/critic_eval/t/summary.json").read_text())
    assert summary["critics"]["configured"]["char_f1"] == 1.0
    assert (project / "data/critic_eval/audit=t/part-0.parquet").is_file()
    again = dvc(["repro", "audit/dvc.yaml"], project).stdout
    assert "Running stage" not in again and "didn't change" in again

    params = yaml.safe_load((project / "params.yaml").read_text())
    params["critic"]["rewards"] = {"toxic": -1.0}  # a critic key outside the cache key
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    status = dvc(["status", "audit/dvc.yaml"], project).stdout
    assert "params.yaml" in status and "modified:" in status and "critic" in status
    rerun = dvc(["repro", "audit/dvc.yaml"], project).stdout
    assert "Running stage" in rerun and "0 requests sent, 1 cache hits" in rerun


def test_dvc_form_needs_a_dvc_project_root(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "posts.jsonl").write_text(json.dumps({"text": "x", "spans": []}) + "\n")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_params(task="toxicity")))
    with pytest.raises(SystemExit) as exit_info:
        main(["critic", "eval", "--spans", "posts.jsonl", "--dvc", "audit"])
    assert exit_info.value.code == 2 and "is not the root of a DVC project" in capsys.readouterr().err
    assert not (tmp_path / "audit").exists()
