"""The tolerant critic path end to end: real DVC, a real `drlc critic serve --layout messy`
process on loopback, the real HTTP client, and the demo DAG up to the first critique.

The annotations must carry spans, honest statuses, and exactly the spans the drlc format
gives for the same rollouts (computed here in-process with a drlc-format server).
"""
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from e2e import dvc, make_project, tiny_params
from transformers import AutoTokenizer

from pipeline.core import store
from pipeline.core.cache import CriticCache
from pipeline.critic.annotate import annotate_round
from pipeline.critic.client import CriticClient
from pipeline.critic.offline.server import serve_in_background
from pipeline.critic.templates import load_template
from pipeline.steps.critique import scored_rows

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def messy_server(tmp_path):
    port = free_port()
    log = open(tmp_path / "server.log", "w")
    process = subprocess.Popen([sys.executable, "-m", "pipeline", "critic", "serve", "--port", str(port),
                                "--layout", "messy"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"{url}/models", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise AssertionError(f"the critic server did not start: {(tmp_path / 'server.log').read_text()}")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


def test_messy_answers_give_the_drlc_formats_spans_through_dvc(tmp_path, messy_server):
    params = tiny_params(n_rounds=1, base={"steps": 60},
                         critic={"endpoint": messy_server, "threshold": 1e9, "labels": []})
    project = make_project(tmp_path, params)
    dvc(["repro", "critique@0001"], project)

    annotations = store.read_table(project / "data" / "annotations" / "round=0001", "annotations")
    critiqued = [a for a in annotations if a["critiqued"]]
    assert len(critiqued) == len(annotations) == 32
    assert {a["status"] for a in critiqued} <= {"ok", "none"}, {a["status"]: a["raw_text"] for a in critiqued}
    assert all(bool(a["spans"]) == (a["status"] == "ok") for a in critiqued)
    assert all(a["items"] == [] for a in critiqued if a["status"] == "none")
    assert all(a["dropped"] == [] and a["attempts"] == 1 for a in critiqued)
    assert sum(a["status"] == "ok" for a in critiqued) >= 5
    assert any("\r\n" in a["raw_text"] for a in critiqued)  # the messy layouts really were used

    rows = scored_rows(store.read_table(project / "data" / "rollouts" / "round=0001", "rollouts"),
                       store.read_table(project / "data" / "scores" / "round=0001", "scores"))
    template = load_template(project / "prompts" / "sentiment.md")
    tokenizer = AutoTokenizer.from_pretrained(project / "models" / "base")
    with CriticCache(tmp_path / "drlc-cache") as cache, serve_in_background(backend="lexicon") as (url, _):
        reference = annotate_round(rows, template=template, tokenizer=tokenizer, cache=cache,
                                   client=CriticClient(base_url=url, model="drlc-lexicon", timeout_s=10.0),
                                   threshold=1e9, rewards=dict(params["critic"]["rewards"]), alignment="exact",
                                   progress=False)
    by_id = {a["rollout_id"]: a for a in annotations}
    for drlc in reference:
        messy = by_id[drlc["rollout_id"]]
        assert messy["raw_text"] != drlc["raw_text"] or messy["status"] == "none"
        assert (messy["status"], messy["spans"], messy["token_rewards"]) == \
            (drlc["status"], drlc["spans"], drlc["token_rewards"]), messy["raw_text"]
