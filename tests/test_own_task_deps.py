"""A task file's deps follow its code (pipeline/core/code_deps.py task_closure, pipeline/tasks/_deps.py): the
files of tasks/ it imports, transitively, and its template, and nothing else of tasks/; the reward's version and
the rule critic's cache identity hash that same closure; a task name that shadows an installed module is refused."""
import shutil
from pathlib import Path

import pytest
import yaml
from inprocess import drlc

from pipeline.core.code_deps import code_sha, task_closure
from pipeline.core.config import load_params
from pipeline.core.errors import ConfigError
from pipeline.steps.critique import critic_model_id
from pipeline.tasks import get_task
from pipeline.tasks._deps import sync_task_deps, task_deps, with_task_deps, write_task_deps
from test_dvc_deps import dvc_yaml_stages

ROOT = Path(__file__).resolve().parents[1]

TASK = '''import json
import words
from helpers.lists import GOOD
from weights import WEIGHT
LABELS = ("concept", "filler")
def reward(prompts, completions, **columns):
    return [WEIGHT * sum(w in GOOD for w in c.split()) for c in completions]
def critic(query, response):
    return {"concept": [w for w in response.split() if w in GOOD], "filler": []}
'''


@pytest.fixture
def project(tmp_path, monkeypatch):
    """tasks/mine.py importing a sibling module, a package's submodule and tasks.weights; one helper imports
    another; tasks/other.py and tasks/unused.py are imported by nobody."""
    files = {"mine.py": TASK, "words.py": "import re\nfrom stems import STEM\n", "stems.py": "STEM = 'x'\n",
             "helpers/__init__.py": "", "helpers/lists.py": "GOOD = {'good'}\n", "weights.py": "WEIGHT = 2.0\n",
             "other.py": "def reward(p, c):\n    return [0.0] * len(c)\n", "unused.py": "X = 1\n"}
    for name, text in files.items():
        (tmp_path / "tasks" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tasks" / name).write_text(text)
    template = (ROOT / "tasks/commongen.md").read_text().replace("commongen", "mine")
    (tmp_path / "tasks/mine.md").write_text(template)
    shutil.copytree(ROOT / "prompts", tmp_path / "prompts")
    shutil.copy(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["run"]["task"], raw["score"]["scorer"] = "tasks/mine.py", "reward"
    raw["critic"].update(template="tasks/mine.md", rewards={"concept": 0.5}, backend="rules", model_dir="tasks/mine.py")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.chdir(tmp_path)
    return tmp_path


CLOSURE = ["tasks/helpers/__init__.py", "tasks/helpers/lists.py", "tasks/mine.py", "tasks/stems.py",
           "tasks/weights.py", "tasks/words.py"]


def test_the_closure_is_the_task_file_and_the_tasks_modules_it_imports_transitively(project):
    assert task_closure("tasks/mine.py", root=project) == CLOSURE  # json is no project code; other.py, unused.py unread
    assert task_closure("tasks/other.py", root=project) == ["tasks/other.py"]


@pytest.mark.parametrize("helper", ["tasks/stems.py", "tasks/helpers/lists.py", "tasks/mine.py"])
def test_a_helper_edit_changes_the_reward_version_and_the_rule_critics_cache_identity(project, helper):
    params = load_params(project / "params.yaml")
    version, identity = get_task("tasks/mine.py").make_reward(params.score).version, critic_model_id(params.critic)
    assert identity == f"drlc-local:rules:{version}" == f"drlc-local:rules:{code_sha('tasks/mine.py', root=project)}"
    (project / helper).write_text((project / helper).read_text() + "# edited\n")
    assert get_task("tasks/mine.py").make_reward(params.score).version != version
    assert critic_model_id(params.critic) != identity


def test_an_edit_outside_the_closure_changes_neither(project):
    params = load_params(project / "params.yaml")
    version, identity = get_task("tasks/mine.py").make_reward(params.score).version, critic_model_id(params.critic)
    (project / "tasks/unused.py").write_text("X = 2\n")
    (project / "tasks/other.py").write_text("# edited\n")
    assert (get_task("tasks/mine.py").make_reward(params.score).version, critic_model_id(params.critic)) == \
        (version, identity)


def test_dvc_yaml_gets_the_closure_in_the_stages_that_run_a_task_and_the_template_where_templates_are_read(project):
    deps = write_task_deps(load_params(project / "params.yaml"), project)
    assert deps == {"code": CLOSURE, "templates": ["tasks/mine.md"]}
    stages = yaml.safe_load((project / "dvc.yaml").read_text())["stages"]
    for name, (_, checkout_deps) in dvc_yaml_stages().items():
        stage_deps = (stages[name].get("do") or stages[name])["deps"]
        on_tasks = [d for d in stage_deps if d.startswith("tasks")]
        runs_a_task = "pipeline/tasks" in checkout_deps  # tests/test_dvc_deps.py: deps = the script's import closure
        reads_templates = "prompts" in stage_deps
        assert on_tasks == (CLOSURE if runs_a_task else []) + (["tasks/mine.md"] if reads_templates else []), name
    assert sync_task_deps(load_params(project / "params.yaml"), project) is None  # up to date: nothing to change


def test_a_built_in_task_depends_on_no_file_of_tasks_and_the_checkout_says_so():
    text = (ROOT / "dvc.yaml").read_text()
    assert with_task_deps(text, {"code": [], "templates": []}) == text
    assert all(not d.startswith("tasks") for _, deps in dvc_yaml_stages().values() for d in deps)
    assert task_deps(load_params(ROOT / "params.yaml"), ROOT) == {"code": [], "templates": []}


def test_drlc_check_and_drlc_task_deps_bring_stale_task_deps_up_to_date_in_one_line(project):
    write_task_deps(load_params(project / "params.yaml"), project)
    (project / "tasks/mine.py").write_text(TASK.replace("import json\n", "import json\nimport unused\n"))
    result = drlc(["check"], project)
    assert result.returncode == 0, result.stderr
    notice = [line for line in result.stdout.splitlines() if line.startswith("dvc.yaml:")]
    assert len(notice) == 1 and "tasks/unused.py" in notice[0] and "(were [" in notice[0], result.stdout
    assert "tasks/unused.py" in (project / "dvc.yaml").read_text()
    assert "dvc.yaml:" not in drlc(["check"], project).stdout  # once up to date, nothing to say
    other = drlc(["task", "deps", "--set", "run.task=tasks/other.py", "--set", "critic.model_dir=tasks/other.py"],
                 project)
    assert other.returncode == 0 and "['tasks/other.py', 'tasks/mine.md']" in other.stdout, other.stderr
    assert "tasks/unused.py" not in (project / "dvc.yaml").read_text()


# -- a task name that would shadow an installed module ---------------------------------------------------------------
@pytest.mark.parametrize("name", ["json", "yaml", "sys"])
def test_a_task_name_that_shadows_an_installed_module_is_refused(project, name):
    result = drlc(["task", "new", name], project)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert f"{name!r} is the name of an installed module" in result.stderr and f"{name}_task" in result.stderr
    (project / "tasks" / f"{name}.py").write_text((project / "tasks/other.py").read_text())
    with pytest.raises(ConfigError, match=f"'run.task' = 'tasks/{name}.py': '{name}' is the name of an installed"):
        get_task(f"tasks/{name}.py")


def test_a_stage_under_dvc_repro_brings_stale_task_deps_up_to_date(project, monkeypatch, capsys):
    from pipeline.tasks import check_params

    params = load_params(project / "params.yaml")
    before = (project / "dvc.yaml").read_text()
    check_params(params)  # outside DVC (no DVC_ROOT): dvc.yaml is left alone
    assert (project / "dvc.yaml").read_text() == before
    monkeypatch.setenv("DVC_ROOT", str(project))
    check_params(params)
    assert "dvc.yaml: the stages that run 'tasks/mine.py' now depend on" in capsys.readouterr().err
    assert sync_task_deps(params, project) is None and "tasks/stems.py" in (project / "dvc.yaml").read_text()


def test_commongens_stages_depend_on_its_file_its_helper_and_its_template():
    assert task_deps(load_params(ROOT / "configs/commongen.yaml"), ROOT) == {
        "code": ["tasks/commongen.py", "tasks/commongen_words.py"], "templates": ["tasks/commongen.md"]}
