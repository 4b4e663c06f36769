"""The house of pipeline/: layers that import only downwards, no import cycles, narrow stage deps.

The graph is read statically by pipeline/core/code_deps.py (lazy imports inside functions
count: they run when their function does). LAYERS lists the folders lowest first.
"""
import functools
import json
import re
from pathlib import Path

import pytest
import yaml
from e2e import dvc, make_project, tiny_params

from pipeline.core.code_deps import CODE_ROOT, LAYERS, covers, import_closure, import_graph, layer_of


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every `a -> b` where b's layer is above a's."""
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    bad = []
    for module, imported in sorted(graph.items()):
        for target in sorted(imported):
            here, there = layer_of(module), layer_of(target)
            if here and there and rank[there] > rank[here]:
                bad.append(f"{module} ({here}) -> {target} ({there})")
    return bad


def test_every_module_lives_in_a_layer():
    loose = [m for m in import_graph() if layer_of(m) is None and m not in ("pipeline", "pipeline.__main__")]
    assert loose == [], f"modules outside the layers {LAYERS}: {loose}"
    folders = sorted(p.name for p in (CODE_ROOT / "pipeline").iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == sorted(LAYERS)


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_no_import_runs_up_a_layer():
    assert upward_imports(import_graph()) == []


def test_the_checks_can_fail():
    graph = {"pipeline.core.a": {"pipeline.critic.b"}, "pipeline.critic.b": {"pipeline.core.a"}}
    assert cycles(graph) == [["pipeline.core.a", "pipeline.critic.b"]]
    assert upward_imports(graph) == ["pipeline.core.a (core) -> pipeline.critic.b (critic)"]


def stage_deps() -> dict[str, list[str]]:
    stages = yaml.safe_load((CODE_ROOT / "dvc.yaml").read_text())["stages"]
    return {name: stage.get("do", stage)["deps"] for name, stage in stages.items()}


def test_early_stages_do_not_depend_on_the_critic():
    """Editing the critic's client, parser or server re-runs neither pretraining nor a round's first steps."""
    deps = stage_deps()
    for stage in ("prepare", "base", "rollout", "score", "ppo"):
        critic = [d for d in deps[stage] if covers("pipeline/critic", d) or covers(d, "pipeline/critic/client.py")]
        assert critic == [], f"{stage} depends on {critic}"
    assert any(covers(d, "pipeline/critic/client.py") for d in deps["critique"])


def test_only_the_stages_that_run_a_model_depend_on_it():
    for stage in ("prepare", "score"):
        assert not [m for m in import_closure(_script(stage)) if m.startswith(("pipeline/train/", "pipeline/parallel/d"))]
    for stage in ("base", "rollout", "ppo"):
        assert not [m for m in import_closure(_script(stage)) if m.startswith(("pipeline/tasks/", "pipeline/rewards/"))]


def _script(stage: str) -> str:
    stages = yaml.safe_load((CODE_ROOT / "dvc.yaml").read_text())["stages"]
    return re.match(r"python (stages/\w+\.py)", stages[stage].get("do", stages[stage])["cmd"]).group(1)


def test_readme_layout_names_every_folder():
    text = (CODE_ROOT / "README.md").read_text()
    layout = text[text.index("## Layout"):]
    layout = layout[:layout.index("\n## ", 1)] if "\n## " in layout[1:] else layout
    folders = {p.relative_to(CODE_ROOT).as_posix() for p in (CODE_ROOT / "pipeline").rglob("*")
               if p.is_dir() and p.name != "__pycache__"}
    top = {p.name for p in CODE_ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")
           and p.name not in ("data", "cache", "models", "metrics", "audit") and (CODE_ROOT / ".git").exists()
           and _tracked(p)}
    missing = sorted(f for f in folders | top if f"{f}/" not in layout)
    assert missing == [], f"README's Layout section does not name {missing}"


def _tracked(path: Path) -> bool:
    """Whether git's index holds a file under the top folder `path` (`git ls-files -- NAME` non-empty), read
    in this process with dulwich (installed with DVC)."""
    return path.name in _tracked_top_folders()


@functools.cache
def _tracked_top_folders() -> frozenset[str]:
    from dulwich.repo import Repo

    with Repo(str(CODE_ROOT)) as repo:
        return frozenset(p.split(b"/", 1)[0].decode() for p in repo.open_index().paths() if b"/" in p)


@pytest.mark.slow
def test_editing_the_critic_client_reruns_only_the_critique(tmp_path):
    """With the real DVC: after an edit of critic/client.py and of run.device, `dvc status` lists the
    critique stage, and leaves prepare, base, rollout@0001 and score@0001 alone."""
    project = make_project(tmp_path, tiny_params(n_rounds=1))
    dvc(["repro", "critique@0001"], project)
    client = project / "pipeline" / "critic" / "client.py"
    client.write_text(client.read_text() + "\n# an edit of the retry logic\n")
    changed = json.loads(dvc(["status", "--json"], project).stdout)
    assert "critique@0001" in changed
    assert not {"prepare", "base", "rollout@0001", "score@0001"} & set(changed), changed
