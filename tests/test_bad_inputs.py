"""Bad input stops with one stderr line naming the value and the fix, exit code 2, no output."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def drlc(args, cwd):
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=cwd, capture_output=True, text=True)


def stage(name, args, cwd):
    return subprocess.run([sys.executable, str(ROOT / "stages" / f"{name}.py"), *args], cwd=cwd,
                          capture_output=True, text=True)


def assert_clean_failure(result, *needles):
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture
def workdir(tmp_path):
    shutil.copytree(ROOT / "prompts", tmp_path / "prompts")
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    return tmp_path


def edit_params(workdir, edit):
    raw = yaml.safe_load((workdir / "params.yaml").read_text())
    edit(raw)
    (workdir / "params.yaml").write_text(yaml.safe_dump(raw))


def test_demo_params_pass_the_check(workdir):
    result = drlc(["check"], workdir)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


@pytest.mark.parametrize("edit, needles", [
    (lambda r: r["ppo"].update(learnig_rate=0.1), ["ppo.learnig_rate", "learning_rate"]),
    (lambda r: r["rollout"].update(max_new_tokens="20"), ["rollout.max_new_tokens", "'20'", "int"]),
    (lambda r: r["critic"].update(alignment="fuzzy"), ["critic.alignment", "'fuzzy'", "exact"]),
    (lambda r: r["critic"].update(rewards={"positive": 0.5, "toxic": -1.0}), ["toxic", "positive"]),
    (lambda r: r["critic"].update(template="prompts/missing.md"), ["prompts/missing.md"]),
    (lambda r: r["critic"].update(endpoint="api.example.com/v1"), ["critic.endpoint", "api.example.com/v1"]),
    (lambda r: r["critic"].update(endpoint="https://api.openai.com/v1"), ["OPENAI_API_KEY"]),
])
def test_bad_params_fail_the_check(workdir, monkeypatch, edit, needles):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    edit_params(workdir, edit)
    assert_clean_failure(drlc(["check"], workdir), *needles)


def test_template_without_its_placeholder(workdir):
    template = workdir / "prompts" / "sentiment.md"
    template.write_text(template.read_text().replace("{response}", "the response"))
    assert_clean_failure(drlc(["check"], workdir), "sentiment.md", "response")


def test_stage_with_bad_params_stops_before_writing(workdir):
    edit_params(workdir, lambda r: r["score"].update(scale="big"))
    out = workdir / "data" / "scores" / "round=0001"
    result = stage("score", ["--round", "0001", "--rollouts", "data/rollouts/round=0001", "--out", str(out)], workdir)
    assert_clean_failure(result, "score.scale", "'big'")
    assert not out.exists()


def test_stage_with_a_missing_input_table(workdir):
    out = workdir / "data" / "scores" / "round=0001"
    result = stage("score", ["--round", "0001", "--rollouts", "data/rollouts/round=0001", "--out", str(out)], workdir)
    assert_clean_failure(result, "data/rollouts/round=0001/part-0.parquet", "not found")
    assert not out.exists()


def test_stage_with_an_unknown_round(workdir):
    result = stage("score", ["--round", "0042", "--rollouts", "x", "--out", "y"], workdir)
    assert_clean_failure(result, "0042", "0001")


@pytest.mark.parametrize("args", [[], ["check"], ["replay"], ["report"], ["sql"], ["catalog"], ["cache"], ["critic"], ["critic", "serve"]])
def test_every_subcommand_has_help(args, workdir):
    result = drlc([*args, "--help"], workdir)
    assert result.returncode == 0 and "usage: drlc" in result.stdout


def test_sql_error_is_one_line(workdir):
    result = drlc(["sql", "SELECT nope FROM nowhere"], workdir)
    assert_clean_failure(result, "Query failed")
