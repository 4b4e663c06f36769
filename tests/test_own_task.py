"""A task of your own in one file (pipeline/tasks/_from_file.py): loading it, its bad inputs, its prompts,
its rule critic, the skeleton `drlc task new` writes, and the CommonGen example (tasks/commongen.py).

Every check here runs in the test process; tests/test_own_task_dvc.py runs task files under real DVC."""
import json
import math
import shutil
from pathlib import Path

import pytest
import yaml
from inprocess import drlc, stage

from pipeline.core import store
from pipeline.core.config import ScoreParams, WorldParams, load_params
from pipeline.core.errors import ConfigError, DataError, RewardError
from pipeline.steps.score import check_rewards, score_round
from pipeline.tasks import get_task
from pipeline.tasks._from_file import load_task_file

ROOT = Path(__file__).resolve().parents[1]
REWARD_LINE = 3  # the line of `return` in GOOD_TASK and its broken variants


GOOD_TASK = '''LABELS = ("good", "bad")
def reward(prompts, completions, **columns):
    return [float(len(c.split())) for c in completions]
'''


def write_task(root: Path, text: str = GOOD_TASK, name: str = "mine") -> str:
    (root / "tasks").mkdir(exist_ok=True)
    (root / "tasks" / f"{name}.py").write_text(text)
    return f"tasks/{name}.py"


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A folder with the demo params.yaml and the shipped templates, as the working directory."""
    shutil.copytree(ROOT / "prompts", tmp_path / "prompts")
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def rollout_rows(n: int, round_: int = 1) -> list[dict]:
    return [{"run_id": "t", "round": round_, "rollout_id": f"r{round_:04d}-{i:05d}", "prompt_id": f"train-{i % 2:05d}",
             "query": f"q{i % 2}", "response": ["one", "one two", "one two three"][i % 3], "query_ids": [1], "response_ids": [2],
             "behaviour_logprobs": [-0.5], "seed": 0, "max_new_tokens": 4, "policy": "base"} for i in range(n)]


def prompt_rows() -> list[dict]:
    return [{"run_id": "t", "round": 0, "prompt_id": f"train-{i:05d}", "split": "train", "text": f"q{i}",
             "reference": "", "columns": json.dumps({"concepts": [f"c{i}", "x"]})} for i in range(2)]


# -- loading: one ConfigError naming the setting, the file and the fix ---------------------------------------------
def test_a_task_file_presents_the_task_interface(project):
    task = get_task(write_task(project))
    assert task.SCORERS == ("reward",) and task.LABELS == ("good", "bad") and task.MODEL_SCORERS == ()
    assert get_task("tasks.mine").path == task.path  # the module path names the same file


@pytest.mark.parametrize("text, needles", [
    (None, ["'run.task' = 'tasks/mine.py'", "no file", "drlc task new"]),
    ("def reward(prompts, completions):\n    return [\n", ["importing it failed", "mine.py line 2", "SyntaxError"]),
    ("import json\nraise ValueError('bad setup')\n", ["importing it failed", "mine.py line 2", "bad setup"]),
])
def test_a_missing_or_broken_task_file(project, text, needles):
    if text is not None:
        write_task(project, text)
    with pytest.raises(ConfigError) as error:
        get_task("tasks/mine.py")
    for needle in needles:
        assert needle in str(error.value), str(error.value)


def test_a_task_file_outside_tasks_is_refused(project):
    (project / "elsewhere").mkdir()
    (project / "elsewhere" / "mine.py").write_text(GOOD_TASK)
    with pytest.raises(ConfigError, match="lies outside tasks/, the folder DVC tracks"):
        get_task("elsewhere/mine.py")


def test_a_missing_reward_function_names_the_file_and_the_functions_it_has(project):
    spec = write_task(project)
    with pytest.raises(ConfigError, match="'score.scorer' = 'score_me': a task file's reward is 'reward'"):
        get_task(spec).make_reward(ScoreParams(scorer="score_me"))
    write_task(project, GOOD_TASK.replace("def reward", "def score_it") + "def uses(word):\n    return True\n")
    with pytest.raises(ConfigError) as error:
        get_task(spec).make_reward(ScoreParams(scorer="reward"))
    assert "tasks/mine.py declares no reward (its functions: ['score_it', 'uses'])" in str(error.value)
    assert "REWARDS = [f, g]" in str(error.value)


# -- the reward's values: one per response, finite floats, for task files and built-in rewards alike ---------------
def score_with(project, text):
    spec = write_task(project, text)
    return score_round(rollout_rows(4), prompt_rows(), task=spec, run_id="t", round_=1,
                       params=ScoreParams(scorer="reward"))


def test_a_task_files_reward_scores_each_response_with_its_prompts_columns(project):
    text = ('def reward(prompts, completions, concepts):\n'
            '    return [len(c) + 10 * len(k) + (0.5 if p == "q1" else 0) for p, c, k in zip(prompts, completions, concepts)]\n')
    rows, metrics = score_with(project, text)
    # responses "one", "one two", "one two three", "one"; two concepts each; prompts q0, q1, q0, q1
    assert [r["env_reward"] for r in rows] == [23.0, 27.5, 33.0, 23.5]
    assert rows[0]["scorer"] == "mine.reward" and len(rows[0]["scorer_version"]) == 12


@pytest.mark.parametrize("body, needles", [
    ("    raise KeyError('concept')", ["reward reward raised on 4 responses", "mine.py line 3", "KeyError"]),
    ("    return [1.0] * (len(completions) - 1)", ["returned 3 values for 4 responses", "r0001-00000 to r0001-00003"]),
    ("    return [1.0, float('nan'), 1.0, 1.0]", ["returned nan", "response r0001-00001", "tasks/mine.py"]),
    ("    return [1.0, 'high', 1.0, 1.0]", ["returned 'high' (str)", "response r0001-00001"]),
    ("    return [1.0, None, 1.0, 1.0]", ["no reward applies to response r0001-00001", "returned None"]),
    ("    return 1.0", ["returned float, not a list"]),
])
def test_a_bad_reward_is_one_error_naming_the_file_and_the_row(project, body, needles):
    with pytest.raises(RewardError) as error:
        score_with(project, f"def reward(prompts, completions, **columns):\n    x = 1\n{body}\n")
    for needle in needles:
        assert needle in str(error.value), str(error.value)


def test_numpy_and_integer_rewards_are_floats(project):
    rows, _ = score_with(project, "import numpy as np\ndef reward(prompts, completions, **c):\n"
                                  "    return np.array([1, 2, 3, 4], dtype=np.float32)\n")
    assert [r["env_reward"] for r in rows] == [1.0, 2.0, 3.0, 4.0] and type(rows[0]["env_reward"]) is float


def test_a_built_in_reward_that_returns_too_few_values_is_refused():
    from pipeline.rewards.sentiment import VaderReward

    class ShortVader(VaderReward):  # the bug the check exists for: a zip would truncate the scores table
        def score(self, texts, **kwargs):
            return super().score(texts, **kwargs)[:-1]

    with pytest.raises(RewardError, match=r"scorer 'vader' \(test_own_task.py\) returned 3 values for 4 responses"):
        score_round(rollout_rows(4), None, task="sentiment", run_id="t", round_=1, params=ScoreParams(),
                    reward=ShortVader())


def test_check_rewards_passes_good_values_through():
    assert check_rewards([1, 0.5, -2], ["a", "b", "c"], who="r") == [1.0, 0.5, -2.0]
    with pytest.raises(RewardError, match="returned inf"):
        check_rewards([math.inf], ["a"], who="r")
    with pytest.raises(RewardError, match="returned True"):
        check_rewards([True], ["a"], who="r")
    with pytest.raises(RewardError, match="returned 1 values for 0 responses: return one float"):
        check_rewards([1.0], [], who="r")


# -- the score stage: one stderr line, exit 2, nothing already written removed --------------------------------------
def test_the_score_stage_stops_on_a_bad_reward_and_keeps_finished_rounds(project):
    spec = write_task(project, "def reward(prompts, completions, **columns):\n    return [0.0]\n")
    raw = yaml.safe_load((project / "params.yaml").read_text())
    raw["run"]["task"], raw["score"]["scorer"] = spec, "reward"
    (project / "params.yaml").write_text(yaml.safe_dump(raw))
    store.write_table(rollout_rows(4), "rollouts", project / "data/rollouts/round=0001")
    store.write_table(prompt_rows(), "prompts", project / "data/prompts/round=0000")
    finished = store.write_table([{"run_id": "t", "round": 0, "rollout_id": "r0000-00000", "env_reward": 1.0,
                                   "env_reward_shaped": 1.0, "scorer": "x", "scorer_version": "1"}], "scores",
                               project / "data/scores/round=0000")
    before = finished.read_bytes()
    result = stage("score", ["--round", "0001", "--rollouts", "data/rollouts/round=0001",
                             "--prompts", "data/prompts/round=0000", "--out", "data/scores/round=0001",
                             "--metrics", "metrics/score/round=0001.json"], project)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if not line.startswith("score: ")]  # progress bar
    assert len(lines) == 1 and "returned 1 values for 4 responses" in lines[0] and "tasks/mine.py" in lines[0], lines
    assert finished.read_bytes() == before and not (project / "data/scores/round=0001").exists()


# -- drlc check: the static problems, before DVC deletes anything ---------------------------------------------------
def check_with(project, task_text, **changes):
    spec = write_task(project, task_text)
    template = (ROOT / "tasks" / "commongen.md").read_text().replace("task: commongen", "task: mine")
    (project / "tasks" / "mine.md").write_text(template.replace("Task: commongen", "Task: mine"))
    raw = yaml.safe_load((project / "params.yaml").read_text())
    raw["run"]["task"], raw["score"]["scorer"] = spec, "reward"
    raw["critic"].update(template="tasks/mine.md", rewards={"concept": 0.5}, backend="rules", model_dir=spec)
    for key, value in changes.items():
        section, name = key.split("__")
        raw[section][name] = value
    (project / "params.yaml").write_text(yaml.safe_dump(raw))
    return drlc(["check"], project)


def test_drlc_check_passes_a_good_task_file(project):
    text = GOOD_TASK.replace('("good", "bad")', '("concept", "filler")')
    result = check_with(project, text)
    assert result.returncode == 0 and "task tasks/mine.py" in result.stdout, result.stderr


@pytest.mark.parametrize("text, changes, needles", [
    (GOOD_TASK, {}, ["has labels ['concept', 'filler']", "does not declare", "LABELS = ['good', 'bad']"]),
    (GOOD_TASK.replace("def reward", "def score_it"), {}, ["'score.scorer' = 'reward'", "['score_it']"]),
    (GOOD_TASK.replace('("good", "bad")', '("concept", "filler")'), {"critic__model_dir": None},
     ["'critic.backend' = 'rules'", "'critic.model_dir' = None"]),
    (GOOD_TASK.replace('("good", "bad")', '("concept", "filler")'), {"critic__backend": "lexicon"},
     ["'critic.backend' = 'lexicon' knows the built-in tasks only", "use rules"]),
    (GOOD_TASK.replace('("good", "bad")', '("concept", "filler")'), {"run__task": "tasks/other.py"},
     ["'run.task' = 'tasks/other.py'", "no file"]),
])
def test_drlc_check_refuses_a_bad_task_in_one_line(project, text, changes, needles):
    result = check_with(project, text, **changes)
    assert result.returncode == 2, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_world_eval_source_is_refused_for_a_built_in_task(project):
    raw = yaml.safe_load((project / "params.yaml").read_text())
    raw["world"]["eval_source"] = "prompts.jsonl"
    (project / "params.yaml").write_text(yaml.safe_dump(raw))
    result = drlc(["check"], project)
    assert result.returncode == 2 and "'world.eval_source'" in result.stderr and "task files only" in result.stderr


# -- prompts: the source's records, their columns, and separate train and eval sources ------------------------------
def test_prompts_from_a_text_file_and_a_separate_eval_source(project):
    write_task(project, GOOD_TASK + "def prompt(record):\n"
               "    words = record['text'].split() if 'text' in record else record['set'].split('#')\n"
               "    return {'prompt': 'Use: ' + ', '.join(words), 'words': words}\n")
    (project / "train.txt").write_text("a b\na b\nc d\n\ne f\n")  # a repeat and a blank line
    (project / "dev.jsonl").write_text('{"set": "c#d"}\n{"set": "g#h"}\n')
    world = WorldParams(source="train.txt", eval_source="dev.jsonl", n_train_prompts=10, n_eval_prompts=10)
    corpus, splits = get_task("tasks/mine.py").build(world, seed=0)
    assert sorted(p["text"] for p in splits["train"]) == ["Use: a, b", "Use: c, d", "Use: e, f"]
    assert [p["text"] for p in splits["eval"]] == ["Use: g, h"]  # "c, d" is a training prompt: not evaluated
    assert json.loads(splits["eval"][0]["columns"]) == {"words": ["g", "h"]}
    assert sorted(corpus) == ["Use: a, b", "Use: a, b", "Use: c, d", "Use: e, f"]


def test_a_record_without_prompt_text_names_the_fix(project):
    write_task(project)
    (project / "data.jsonl").write_text('{"question": "why"}\n')
    with pytest.raises(DataError, match=r"no prompt text .*found \['question'\]\): define prompt\(record\)"):
        get_task("tasks/mine.py").build(WorldParams(source="data.jsonl", n_eval_prompts=1), seed=0)


# -- the rule critic, served by drlc's local server ------------------------------------------------------------------
def test_the_rules_backend_answers_from_the_files_critic_over_http(project):
    from pipeline.critic.offline.server import serve_in_background
    from pipeline.critic.templates import load_template
    import urllib.request

    spec = write_task(project, 'def reward(prompts, completions):\n    return [0.0] * len(completions)\n'
                               'def critic(query, response):\n'
                               '    return {"concept": [w for w in response.split() if w in query], "filler": []}\n')
    template = load_template(ROOT / "tasks" / "commongen.md", task="commongen")
    messages = template.render({"query": "Use: dog, park", "response": "a dog ran in the park"})
    with serve_in_background(backend="rules", model_dir=spec, labels=template.labels) as (url, stats):
        body = json.dumps({"model": "m", "messages": messages}).encode()
        request = urllib.request.Request(f"{url}/chat/completions", body, {"Content-Type": "application/json"})
        answer = json.loads(urllib.request.urlopen(request).read())["choices"][0]["message"]["content"]
    assert answer == 'Concept: "a"; "dog"; "park"\nFiller: none'  # "a" is in the query's "park": the rule's own choice


def test_the_rules_backend_needs_a_critic_function(project):
    from pipeline.core.errors import CriticError
    from pipeline.critic.offline.rules import RuleBackend

    with pytest.raises(CriticError, match="defines no function critic"):
        RuleBackend(write_task(project), labels=("good",))


# -- drlc task new ---------------------------------------------------------------------------------------------------
def test_task_new_writes_a_skeleton_whose_profile_passes_the_check(project):
    result = drlc(["task", "new", "concepts"], project)
    assert result.returncode == 0, result.stderr
    for path in ("tasks/concepts.py", "tasks/concepts.md", "configs/concepts.yaml"):
        assert (project / path).is_file(), path
    params = load_params(project / "configs/concepts.yaml")
    assert (params.run.task, params.score.scorer, params.critic.backend) == ("tasks/concepts.py", "reward", "rules")
    assert dict(params.critic.rewards) == {"good": 0.5, "bad": -0.5}
    shutil.copy(project / "configs/concepts.yaml", project / "params.yaml")
    assert drlc(["check"], project).returncode == 0
    task = get_task("tasks/concepts.py")
    assert task.make_reward(params.score).score(["great fun", "a dull day"], references=["", ""],
                                                queries=["", ""]) == [1.0, 0.0]


def test_task_new_overwrites_nothing_and_refuses_a_bad_name(project):
    assert drlc(["task", "new", "concepts"], project).returncode == 0
    (project / "tasks" / "concepts.py").write_text("# mine now\n")
    again = drlc(["task", "new", "concepts"], project)
    assert again.returncode == 2 and "already exist" in again.stderr
    assert (project / "tasks" / "concepts.py").read_text() == "# mine now\n"
    for bad in ("Concepts", "sentiment", "1x"):
        assert drlc(["task", "new", bad], project).returncode == 2


# -- the CommonGen example ------------------------------------------------------------------------------------------
@pytest.fixture
def commongen():
    return load_task_file("tasks/commongen.py", root=ROOT).module


def test_commongen_coverage_counts_inflections(commongen):
    concepts = ["field", "look", "stand"]
    completions = ["A man stood in a field, looking up.", "The fields look green.", "Nothing here.",
                   "stand stand stand\nfield look"]  # only the first line is the sentence
    assert commongen.coverage([""] * 4, completions, [concepts] * 4) == [1.0, 2 / 3, 0.0, 1 / 3]
    assert commongen.metrics([""] * 4, completions, [concepts] * 4) == {
        "coverage": pytest.approx((1 + 2 / 3 + 0 + 1 / 3) / 4), "all_concepts": 0.25}


def test_commongen_declares_coverage_and_brevity_and_by_default_its_total_is_coverage():
    profile = load_params(ROOT / "configs/commongen.yaml")
    assert profile.score.settings == {"max_words": 16, "brevity_weight": 0.0}
    reward = load_task_file("tasks/commongen.py", root=ROOT).make_reward(profile.score)
    assert [(r.name, r.weight) for r in reward.rewards] == [("coverage", 1.0), ("brevity", 0.0)]
    completions = ["A man stood in a field, looking up.", " ".join(["field"] * 24) + " look stand", "Nothing."]
    totals, terms = reward.score_terms(completions, ids=["a", "b", "c"], queries=[""] * 3,
                                       columns={"concepts": [["field", "look", "stand"]] * 3})
    assert totals == [1.0, 1.0, 0.0]  # brevity at weight 0: today's coverage reward exactly
    # brevity: 8 words -> 1; 26 words -> 2 - 26/16 = 0.375; 1 word -> 1
    assert [t["brevity"] for t in terms] == [1.0, 2 - 26 / 16, 1.0]
    swept = load_params(ROOT / "configs/commongen.yaml", ["score.settings.brevity_weight=0.5"]).score
    assert load_task_file("tasks/commongen.py", root=ROOT).make_reward(swept).score_terms(
        completions[1:2], ids=["b"], queries=[""], columns={"concepts": [["field", "look", "stand"]]})[0] == \
        [1.0 + 0.5 * (2 - 26 / 16)]


def test_a_task_files_total_and_range_stay_in_the_tasks_units_at_any_score_scale():
    """score.scale is applied once, after the reward (pipeline/rewards/shaping.py), for a task file as for a
    built-in reward: the file's totals, terms and RANGE are the task's own numbers."""
    task = load_task_file("tasks/commongen.py", root=ROOT)
    profile = load_params(ROOT / "configs/commongen.yaml")
    scaled = load_params(ROOT / "configs/commongen.yaml", ["score.scale=2.5"]).score
    completions = ["A man stood in a field, looking up.", "The fields look green.", "Nothing."]
    call = dict(ids=["a", "b", "c"], queries=[""] * 3, columns={"concepts": [["field", "look", "stand"]] * 3})
    (totals, terms), (totals_k, terms_k) = (task.make_reward(s).score_terms(completions, **call)
                                            for s in (profile.score, scaled))
    assert totals == totals_k == [1.0, 2 / 3, 0.0]
    assert terms_k == terms
    assert task.reward_range(scaled) == task.reward_range(profile.score) == (0.0, 1.0)


def test_commongen_prompts_from_train_lines_and_dev_rows(commongen):
    train = commongen.prompt({"text": "dog frisbee catch"})
    dev = commongen.prompt({"concept_set": "dog_N#frisbee_N#catch_V", "scene": ["..."]})
    assert train == dev == {"prompt": "Write a sentence using the words: dog, frisbee, catch.\nSentence:",
                            "concepts": ["dog", "frisbee", "catch"]}


def test_commongen_critic_marks_concepts_and_filler(commongen):
    concepts = commongen.prompt({"text": "dog frisbee catch"})["concepts"]  # the column critic() reads
    assert commongen.critic(" The dog caught the frisbee and the dog ran ran ran.\nMore text here", concepts) == {
        "concept": ["dog", "caught", "frisbee"], "filler": ["More text here"]}  # "ran" is 3 letters: not filler
    assert commongen.critic("dogs playing playing", concepts)["filler"] == ["playing"]


def test_a_task_file_is_found_in_the_checkout_from_another_folder(tmp_path, monkeypatch):
    """A replay folder's stages run outside the project: run.task then names the checkout's file."""
    monkeypatch.chdir(tmp_path)
    assert get_task("tasks/commongen.py").path.resolve() == ROOT / "tasks" / "commongen.py"
    with pytest.raises(ConfigError, match="no file"):
        get_task("tasks/nowhere.py")


def test_commongen_benchmark_pairs_dense_and_sparse_by_prompt():
    from benchmarks.commongen import paired_difference

    # differences 0.5, 0.0, -0.25 on the shared prompts: mean 1/12, sd sqrt(((5/12)^2 + (1/12)^2 + (4/12)^2) / 2)
    mean, se, n = paired_difference({"a": 1.0, "b": 0.5, "c": 0.25, "only-dense": 9.0},
                                    {"a": 0.5, "b": 0.5, "c": 0.5})
    assert n == 3 and mean == pytest.approx(1 / 12)
    assert se == pytest.approx((((5 / 12) ** 2 + (1 / 12) ** 2 + (4 / 12) ** 2) / 2) ** 0.5 / 3 ** 0.5)


def test_task_new_reads_a_params_file_without_comments(project):
    """A params.yaml that a program wrote (no comment lines, block lists) still gives a profile that loads."""
    raw = yaml.safe_load((project / "params.yaml").read_text())
    (project / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    assert drlc(["task", "new", "concepts"], project).returncode == 0
    params = load_params(project / "configs/concepts.yaml")
    assert params.run.run_id == "concepts" and params.critic.prices == raw["critic"]["prices"]
