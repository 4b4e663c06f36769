"""`drlc task new NAME`: a working skeleton of a task of your own, in three files.

- ``tasks/NAME.py``: the reward (TRL's ``reward(prompts, completions, **columns)``), the labels
  its critic may name, and a rule critic that drlc's local server runs with no model;
- ``tasks/NAME.md``: the critic template, with those labels;
- ``configs/NAME.yaml``: a params profile, the demo's (params.yaml) with this task, its reward,
  its template and the rule critic, so ``cp configs/NAME.yaml params.yaml && dvc repro`` runs at
  once, offline, on the demo's synthetic review openings.

Profiles are written by changing single lines of the demo profile, so its comments stay.
"""
from __future__ import annotations

import re
from pathlib import Path

from pipeline.core.errors import ConfigError

NAME = re.compile(r"^[a-z][a-z0-9_]*$")

TASK_FILE = '''"""{name}: what the policy should learn. (`drlc task new {name}` wrote this file; make it yours.)"""
RANGE = (0.0, 1.0)  # the reward's bounds (drlc estimate)
LABELS = ("good", "bad")  # the span labels its critic may name (tasks/{name}.md)
GOOD = {{"great", "good", "best", "love", "fun", "funny", "beautiful", "wonderful"}}  # the goal: replace it


def reward(prompts, completions, **columns):
    """One float per completion, higher is better: here the share of its words in GOOD, times 4, at most 1."""
    scores = []
    for completion in completions:
        words = [w.strip(".,!?;:").lower() for w in completion.split()]
        scores.append(min(1.0, 4 * sum(w in GOOD for w in words) / max(len(words), 1)))
    return scores  # more rewards: REWARDS = [reward, other], REWARD_WEIGHTS = [1.0, 0.5] (docs/own-task.md)


def critic(query, response):
    """The rule critic (critic.backend: rules): {{label: [spans copied from the response]}}."""
    words = [w.strip(".,!?;:\\"") for w in response.split()]
    repeated = [w for i, w in enumerate(words) if len(w) > 3 and w in words[:i]]
    return {{"good": sorted({{w for w in words if w.lower() in GOOD}}), "bad": sorted(set(repeated))}}
'''

TEMPLATE = '''---
task: {name}
version: 1
placeholders: [query, response]
labels: [good, bad]
---

## system

A text generator is being trained on a goal. You read what it wrote and point at the words
that serve the goal (good) and the words that work against it (bad).

Task: {name}

Copy every span exactly from the text: a word or a short phrase, never a whole sentence.

### Output format

Reply with exactly two lines:

Good: "<span>"; "<span>"
Bad: "<span>"

Put each span in double quotes, separated by semicolons; write none for a label without spans.

## user

<query>
{{query}}
</query>
<response>
{{response}}
</response>
'''


def profile_for(base_text: str, changes: dict[tuple[str, str], str]) -> str:
    """`base_text` (a params YAML) with each ``(section, key)`` line replaced by ``key: <change>`` (a value and
    its own comment); a nested block under the old line (``rewards:`` and its labels) goes with it.

    Raises ConfigError naming a (section, key) the text has no line for.
    """
    lines = base_text.splitlines()
    for (section, key), change in changes.items():
        at = _line_of(lines, section, key)
        end = at + 1
        while end < len(lines) and lines[end].startswith("    "):
            end += 1
        lines[at:end] = [f"  {key}: {change}"]
    return "\n".join(lines) + "\n"


def _line_of(lines: list[str], section: str, key: str) -> int:
    in_section = False
    for i, line in enumerate(lines):
        if line and not line[0].isspace() and not line.startswith("#"):
            in_section = line.split(":")[0] == section
        elif in_section and line.startswith(f"  {key}:"):
            return i
    raise ConfigError(f"The profile has no '{section}.{key}' line to set: restore it in params.yaml.")


def skeleton_changes(name: str) -> dict[tuple[str, str], str]:
    task = f"tasks/{name}.py"
    return {("run", "run_id"): name,
            ("run", "task"): f"{task}  # your task file (docs/own-task.md)",
            ("score", "scorer"): "reward  # the task file's reward (or the weighted total of its REWARDS)",
            ("critic", "backend"): "rules  # the task file's critic(query, response): no model, offline",
            ("critic", "model_dir"): f"{task}  # the file the rules backend reads",
            ("critic", "model"): "drlc-rules",
            ("critic", "template"): f"tasks/{name}.md",
            ("critic", "threshold"): "0.5  # critique responses whose env reward <= threshold",
            ("critic", "rewards"): "{good: 0.5, bad: -0.5}  # per-token reward of each span label",
            # the demo's 5e-4 tore the skeleton's policy apart (KL 53 in round 2, perplexity 3,516); docs/own-task.md
            ("ppo", "learning_rate"): "1.0e-4  # as the toxicity and summarization demos"}


def write_skeleton(name: str, root: str | Path = ".") -> list[Path]:
    """Write the three files of task `name` under `root`; returns their paths.

    Raises ConfigError for a name that is not a lowercase identifier, a built-in task's name, or one whose
    files exist (nothing is overwritten).
    """
    from pipeline.core.config import TASKS

    if not NAME.match(name) or name in TASKS:
        raise ConfigError(f"Task name {name!r}: use a lowercase identifier (letters, digits, _) that is not a "
                          f"built-in task {TASKS}.")
    check_not_shadowing(name)
    root = Path(root)
    profile = profile_for((root / "params.yaml").read_text(encoding="utf-8"), skeleton_changes(name))
    first, _, rest = profile.partition("\n")
    profile = f"# drlc parameters: task {name} (tasks/{name}.py) on the demo's synthetic review openings, written by " \
              f"`drlc task new {name}`.\n" + (rest if first.startswith("#") else profile)  # replaces the demo's title
    files = {root / "tasks" / f"{name}.py": TASK_FILE.format(name=name),
             root / "tasks" / f"{name}.md": TEMPLATE.format(name=name),
             root / "configs" / f"{name}.yaml": profile}
    existing = [str(p) for p in files if p.exists()]
    if existing:
        raise ConfigError(f"drlc task new {name}: {existing} already exist; pick another name or remove them.")
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    if (root / "dvc.yaml").is_file():  # the task stages depend on the new files: `cp` the profile and dvc repro
        from pipeline.core.config import load_params
        from pipeline.tasks._deps import write_task_deps

        write_task_deps(load_params(root / "configs" / f"{name}.yaml"), root)
    return list(files)


def check_not_shadowing(name: str) -> None:
    """Raise ConfigError when tasks/NAME.py would hide an importable module of that name (`datasets`, `json`):
    drlc puts tasks/ first on sys.path, so every later `import NAME` in the process would load the task file."""
    from pipeline.tasks._from_file import shadowed_module

    if shadowed_module(name):
        raise ConfigError(f"Task name {name!r} is the name of an installed module, which tasks/{name}.py would "
                          f"shadow for every later import: pick another name (e.g. {name}_task).")
