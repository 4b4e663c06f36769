"""Stages and `drlc` commands that run no model start at once: they never import torch or transformers.

Importing torch and transformers takes 1-3 s; a stage that scores with an offline scorer, critiques
through an endpoint, or a command that only reads tables has no use for them. The test runs this
file as a script in one subprocess (the pytest process has imported torch already), which does the
real work of each entry point on a tiny run, in order, and stops at the first one that imports
torch or transformers, naming the chain of the project's import statements that reached it.
Marked slow because it starts a process (the unit tier starts none); it takes about 5 s.
By hand: `python tests/test_import_time.py DIR` after the test has written DIR (see `tiny_run`).
"""
import importlib.abc
import json
import runpy
import sys
import traceback
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODEL_MODULES = ("torch", "transformers")
RESPONSES = ["a good film with a great cast", "the acting was bad and the plot was dull",
             "boring, and the story was awful", "a fine story"]


# ---- the child: python tests/test_import_time.py DIR ----

class ImportWatch(importlib.abc.MetaPathFinder):
    """Keeps, for each of MODEL_MODULES, the project's frames (file:line: statement) of its latest lookup."""

    def __init__(self):
        self.chains: dict[str, list[str]] = {}

    def find_spec(self, name, path=None, target=None):
        if name in MODEL_MODULES and name not in sys.modules:
            self.chains[name] = [f"{Path(f.filename).relative_to(ROOT)}:{f.lineno}: {f.line}"
                                 for f in traceback.extract_stack()[:-1]
                                 if f.filename.startswith((str(ROOT / "pipeline"), str(ROOT / "stages")))]
        return None  # the import itself goes on as usual


def run_script(script: str, *argv: str) -> None:
    """stages/<script> as `python stages/<script> ARGV` would run it, in this process."""
    sys.argv = [script, *argv]
    try:
        runpy.run_path(str(ROOT / script), run_name="__main__")
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            raise RuntimeError(f"{script} {' '.join(argv)} exited {exit_.code}") from None


def drlc(*argv: str) -> None:
    from pipeline.commands.cli import main

    main(list(argv))


def write_rollouts(work: Path) -> None:
    """One round of rollouts of RESPONSES to the prepared train prompts, tokenized with the run's tokenizer."""
    from tokenizers import Tokenizer

    from pipeline.core import store

    tokenizer = Tokenizer.from_file(str(work / "models/base/tokenizer.json"))
    prompts = [p for p in store.read_table(work / "data/prompts/round=0000", "prompts") if p["split"] == "train"]
    rows = [{"run_id": "e2e", "round": 1, "rollout_id": f"r{i}", "prompt_id": prompt["prompt_id"],
             "query": prompt["text"], "response": text, "query_ids": tokenizer.encode(prompt["text"]).ids,
             "response_ids": tokenizer.encode(text).ids, "behaviour_logprobs": [-1.0] * len(tokenizer.encode(text).ids),
             "seed": 0, "max_new_tokens": 20, "policy": "base"}
            for i, (prompt, text) in enumerate(zip(prompts, RESPONSES))]
    store.write_table(rows, "rollouts", work / "data/rollouts/round=0001")


def offline_scorers() -> None:
    """The offline scorers of the other tasks, built and run as the score stage does: lexicon, ROUGE, Perspective."""
    import os

    from pipeline.core.config import ScoreParams
    from pipeline.tasks import get_task

    get_task("toxicity").make_reward(ScoreParams(scorer="lexicon")).score(RESPONSES)
    get_task("summarization").make_reward(ScoreParams(scorer="rouge1")).score(RESPONSES, references=RESPONSES)
    os.environ.setdefault("PERSPECTIVE_API_KEY", "unused")  # built, never asked
    get_task("toxicity").make_reward(ScoreParams(scorer="perspective"))


def entry_points(work: Path) -> list[tuple[str, object]]:
    """(name, run) of each entry point, in the order a round needs them; the rollouts are written by hand."""
    params, data, metrics = str(work / "params.yaml"), work / "data", work / "metrics"
    local = str(work / "params_local.yaml")
    critique = ["--round", "0001", "--rollouts", f"{data}/rollouts/round=0001", "--scores", f"{data}/scores/round=0001",
                "--tokenizer", str(work / "models/base")]
    return [
        ("stages/prepare.py", lambda: run_script("stages/prepare.py", "--params", params, "--corpus", f"{data}/corpus",
                                                 "--prompts", f"{data}/prompts/round=0000")),
        ("writing the rollouts (tokenizers)", lambda: write_rollouts(work)),
        ("stages/score.py (vader)", lambda: run_script(
            "stages/score.py", "--params", params, "--round", "0001", "--rollouts", f"{data}/rollouts/round=0001",
            "--prompts", f"{data}/prompts/round=0000", "--out", f"{data}/scores/round=0001",
            "--metrics", f"{metrics}/score/round=0001.json")),
        ("the offline scorers of toxicity and summarization", offline_scorers),
        ("stages/critique.py (an endpoint)", lambda: run_script(
            "stages/critique.py", "--params", params, *critique, "--out", f"{data}/annotations/round=0001",
            "--metrics", f"{metrics}/critique/round=0001.json")),
        ("stages/critique.py (critic.endpoint local, lexicon)", lambda: run_script(
            "stages/critique.py", "--params", local, *critique, "--out", str(work / "local_annotations"),
            "--metrics", str(work / "local_critique.json"))),
        ("drlc check", lambda: drlc("check", "--params", params)),
        ("drlc sql", lambda: drlc("sql", "SELECT round, avg(env_reward) FROM scores GROUP BY 1", "--data", str(data))),
        ("drlc catalog", lambda: drlc("catalog", "--data", str(data), "--out", str(work / "catalog.sql"))),
        ("drlc view", lambda: drlc("view", str(work), "--out", str(work / "view.html"))),
        ("drlc cache stats", lambda: drlc("cache", "stats", "--dir", str(work / "cache"))),
        ("drlc critic batch-prepare", lambda: drlc("critic", "batch-prepare", "--round", "0001", "--params", params,
                                                   "--data", str(data), "--out", str(work / "batch.jsonl"))),
        ("drlc report", lambda: drlc("report", str(work), "--out", str(work / "reports"))),
        ("drlc rounds --exp", lambda: drlc("rounds", "3", "--params", params, "--exp")),
    ]


def check_entry_points(work: Path) -> int:
    """Run each entry point; print the first that imports a model module, with its import chain. 1 if one did."""
    watch = ImportWatch()
    sys.meta_path.insert(0, watch)
    for name, run in entry_points(work):
        run()
        loaded = [module for module in MODEL_MODULES if module in sys.modules]
        if loaded:
            chain = "\n  -> ".join(watch.chains.get(loaded[0]) or ["(no project frame: imported by a library)"])
            print(f"{name} imported {' and '.join(loaded)}; the first {loaded[0]} import came from:\n  {chain}\n"
                  f"Import it inside the function that runs the model, so this entry point starts at once.")
            return 1
    print(json.dumps({"checked": [name for name, _ in entry_points(work)]}))
    return 0


# ---- the test ----

def tiny_run(work: Path, endpoint: str) -> None:
    """The inputs of check_entry_points in `work`: params (critic at `endpoint`; params_local.yaml: the
    demo's local lexicon server), the demo's BPE tokenizer saved in models/base, and a run's metrics files."""
    import yaml
    from e2e import dump_params, tiny_params

    from pipeline.data.world import generate_reviews
    from pipeline.model.pretrain import train_tokenizer

    params = tiny_params(n_rounds=1)
    params["world"].update(n_reviews=200, n_train_prompts=16, n_eval_prompts=4)
    params["critic"].update(endpoint=endpoint, cache_dir=str(work / "cache"))
    (work / "params.yaml").write_text(dump_params(params))
    params["critic"].update(endpoint="local")
    (work / "params_local.yaml").write_text(dump_params(params))
    train_tokenizer(generate_reviews(200, seed=0), vocab_size=300, out_dir=work / "models/base")
    (work / "metrics").mkdir()
    (work / "metrics/eval.json").write_text(json.dumps({"base": {"world": {"positive_percent": 40.0}}}))
    rounds = [{"round": 1, "env_reward_mean": 0.1, "intrinsic_reward_sum": 0.0, "kl": 0.0, "critic_requests": 2}]
    (work / "metrics/rounds.json").write_text(json.dumps({"rounds": rounds}))
    assert yaml.safe_load((work / "params.yaml").read_text())["critic"]["endpoint"] == endpoint


@pytest.mark.slow  # one subprocess, ~5 s
def test_stages_and_commands_without_a_model_never_import_torch_or_transformers(tmp_path):
    import os
    import subprocess

    from pipeline.critic.offline.server import serve_in_background

    with serve_in_background(backend="lexicon") as (url, _):
        tiny_run(tmp_path, url)
        env = dict(os.environ, TQDM_DISABLE="1")
        result = subprocess.run([sys.executable, __file__, str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                                text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1])["checked"][-1] == "drlc rounds --exp"


if __name__ == "__main__":
    raise SystemExit(check_entry_points(Path(sys.argv[1])))
