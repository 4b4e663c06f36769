"""`drlc rounds N`: params.yaml's rounds chain and evaluate.policy from one number, the rest of the file kept."""
import contextlib
import io
import re
import shutil
import warnings
from pathlib import Path

import pytest
from inprocess import drlc

from pipeline.commands.rounds import exp_run_overrides, round_chain, set_rounds
from pipeline.core.config import load_params
from pipeline.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def params_file(tmp_path):
    return Path(shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml"))


def test_more_rounds_then_back_restores_the_file_byte_for_byte(params_file):
    original = params_file.read_text()
    set_rounds(params_file, 6)
    params = load_params(params_file)
    assert params.round_keys() == [f"{r:04d}" for r in range(1, 7)] and params.evaluate.policy == "round=0006"
    assert params.rounds["0006"].prev == "round=0005"
    changed = [line for line in params_file.read_text().splitlines() if line not in original.splitlines()]
    assert changed == ["  policy: round=0006        # must be the last round below",
                       '  "0005": {prev: round=0004}', '  "0006": {prev: round=0005}']
    set_rounds(params_file, 4)
    assert params_file.read_text() == original  # comments, nulls, number spellings and order all kept


def test_one_round_and_bad_numbers(params_file):
    set_rounds(params_file, 1)
    params = load_params(params_file)
    assert params.round_keys() == ["0001"] and params.evaluate.policy == "round=0001"
    before = params_file.read_text()
    for bad in (0, -3, 10_000):
        with pytest.raises(ConfigError, match=f"{bad} rounds: give a number of rounds from 1 to 9999"):
            set_rounds(params_file, bad)
    assert params_file.read_text() == before


def test_a_file_that_would_not_load_is_left_unchanged(params_file):
    text = params_file.read_text().replace("task: sentiment", "task: poetry")
    params_file.write_text(text)
    with pytest.raises(ConfigError, match="'run.task' = 'poetry'"):
        set_rounds(params_file, 2)
    assert params_file.read_text() == text


@pytest.mark.parametrize("per_stage", [1, 3])
def test_exp_run_overrides_load_as_the_same_chain(params_file, per_stage):
    """The -S values through DVC's own Hydra override code give the file `drlc rounds` writes."""
    from dvc.utils.hydra import apply_overrides

    assert round_chain(3) == {"0001": "base", "0002": "round=0001", "0003": "round=0002"}
    written = params_file.with_name("written.yaml")
    shutil.copy(params_file, written)
    set_rounds(written, 5, per_stage)
    apply_overrides(params_file, exp_run_overrides(5, per_stage))
    assert load_params(params_file) == load_params(written)
    assert load_params(params_file).round_keys() == [f"{r:04d}" for r in range(1, 6)]


def stage_names(status_stdout: str) -> set[str]:
    return set(re.findall(r"^(\S+):$", status_stdout, flags=re.M))


def dvc_project(tmp_path: Path) -> Path:
    """A DVC project (no git) holding this checkout's dvc.yaml and params.yaml: all DVC reads to list and
    order the stages (their dependencies are absent, so every stage is out of date and `dvc status` names it)."""
    from dvc.repo import Repo

    project = tmp_path / "project"
    project.mkdir()
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(ROOT / name, project / name)
    Repo.init(project, no_scm=True).close()
    return project


def dvc_stdout(args: list[str], project: Path, monkeypatch) -> str:
    """What `dvc ARGS` prints in `project`: DVC's own command line (dvc.cli.main), run in this process."""
    from dvc.cli import main

    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")  # else DVC starts a process to send them
    monkeypatch.chdir(project)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "_NoneStep.value", DeprecationWarning)  # inside DVC 3.67's trie code
        code = main(args)
    assert code == 0, f"dvc {' '.join(args)} exited {code}:\n{out.getvalue()[-3000:]}"
    return out.getvalue()


def drlc_rounds(args: list[str], project: Path) -> str:
    done = drlc(["rounds", *args], project)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_dvc_sees_the_new_stage_list(tmp_path, monkeypatch):
    """The real DVC: after `drlc rounds N`, `dvc status` lists exactly N rounds of stages."""
    project = dvc_project(tmp_path)
    drlc_rounds(["2"], project)
    names = stage_names(dvc_stdout(["status"], project, monkeypatch))
    assert {f"{s}@{r}" for s in ("rollout", "score", "critique", "ppo") for r in ("0001", "0002")} <= names
    assert not any(name.endswith("@0003") for name in names) and "evaluate" in names
    drlc_rounds(["5"], project)
    assert "ppo@0005" in stage_names(dvc_stdout(["status"], project, monkeypatch))


def test_switch_after_writes_the_switch_over_and_back(params_file):
    original = params_file.read_text()
    set_rounds(params_file, 5, switch_after=2)
    params = load_params(params_file)
    assert params.round_keys() == [f"{r:04d}" for r in range(1, 6)] and params.evaluate.policy == "round=0005"
    assert params.switch_round() == "0002" and params.switch["0002"].last == "0005" and params.chunks == {}
    text = params_file.read_text()
    assert "rounds: {}\n" in text and 'switch:\n  "0002": {last: "0005"}\n' in text
    params_file.write_text(text.replace('{last: "0005"}', '{last: "0005", seed: 3}'))
    set_rounds(params_file, 6, switch_after=4)  # moved: the seed is kept
    assert load_params(params_file).switch["0004"].seed == 3
    set_rounds(params_file, 4)
    assert params_file.read_text() == original
    for bad in (0, 4, 7):
        with pytest.raises(ConfigError, match=f"--switch-after {bad}: give a round R in 1..3"):
            set_rounds(params_file, 4, switch_after=bad)
    with pytest.raises(ConfigError, match="--switch-after with --per-stage 2"):
        set_rounds(params_file, 4, 2, switch_after=2)
    assert params_file.read_text() == original


def test_switch_exp_run_overrides_load_as_the_file_drlc_rounds_writes(params_file):
    from dvc.utils.hydra import apply_overrides

    written = params_file.with_name("written.yaml")
    shutil.copy(params_file, written)
    set_rounds(written, 5, switch_after=3)
    apply_overrides(params_file, exp_run_overrides(5, switch_after=3))
    assert load_params(params_file) == load_params(written)
    assert exp_run_overrides(5) == exp_run_overrides(5, 1, None)  # no switch: the flags as before


def test_dvc_lists_the_three_switch_stages(tmp_path, monkeypatch):
    project = dvc_project(tmp_path)
    drlc_rounds(["4", "--switch-after", "2"], project)
    names = stage_names(dvc_stdout(["status"], project, monkeypatch))
    assert {"switch_critic@0002", "switch_distill@0002", "switch_tagger@0002", "evaluate"} <= names
    assert not any(name.startswith(("rollout@", "critique@", "chunk@")) for name in names)
    dag = dvc_stdout(["dag", "--dot"], project, monkeypatch)
    assert '"switch_critic@0002" -> "switch_distill@0002"' in dag
    assert '"switch_distill@0002" -> "switch_tagger@0002"' in dag
    later = ("switch_distill@0002", "switch_tagger@0002")
    assert not any(f'"{stage}" -> "switch_critic@0002"' in dag for stage in later)
