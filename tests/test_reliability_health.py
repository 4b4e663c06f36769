"""Health gate: a critique round whose failures pass critic.max_error_rate stops, loses nothing, retries only failures.

The stage script (stages/critique.py, run in the test process by tests/inprocess.py) runs on a
hand-made round of 10 responses (all below the threshold, so all critiqued) against a loopback
critic server (a thread of the test process) that fails chosen requests on purpose (HTTP 500 from
drlc's server, every attempt), answers with 500 always, or does not exist (connection refused).
Checked: the exit code, the one stderr line, that no annotations partition is written, the cache
contents (every good answer, no failure), the counts in the metrics JSON, and on re-run that the
server received only the failed requests.
"""
import json
import shutil
import time
from pathlib import Path

import pytest
import yaml
from conftest import train_bpe
from inprocess import Ran, stage
from reliability import SECRET, RecordingBackend, critic_server, free_port

from pipeline.core import store
from pipeline.core.cache import CriticCache
from pipeline.core.config import load_params
from pipeline.core.errors import CriticError
from pipeline.critic.annotate import round_requests
from pipeline.critic.templates import load_template
from pipeline.steps.critique import check_health, critic_client, scored_rows

ROOT = Path(__file__).resolve().parents[1]
TEXTS = [f"Item{i:02d} was awful and the staff were rude." for i in range(10)]


def make_round(tmp: Path, port: int, **critic) -> Path:
    """A working dir with params.yaml (critic at 127.0.0.1:port), prompts/, a tokenizer and round 0001's tables."""
    tokenizer = train_bpe(TEXTS * 3)
    tokenizer.save_pretrained(str(tmp / "models" / "base"))
    shutil.copytree(ROOT / "prompts", tmp / "prompts")
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["critic"].update(endpoint=f"http://127.0.0.1:{port}/v1", cache_dir=str(tmp / "cache"), max_retries=1,
                         timeout_s=5.0, max_concurrency=4, **critic)
    (tmp / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    keys = {"run_id": "health", "round": 1}
    ids = [tokenizer.encode(text) for text in TEXTS]
    rollouts = [keys | {"rollout_id": f"r{i}", "prompt_id": f"p{i}", "query": "", "response": text, "query_ids": [],
                        "response_ids": ids[i], "behaviour_logprobs": [0.0] * len(ids[i]), "seed": 0,
                        "max_new_tokens": 16, "policy": "base"} for i, text in enumerate(TEXTS)]
    scores = [keys | {"rollout_id": f"r{i}", "env_reward": -1.0, "env_reward_shaped": -1.0, "scorer": "test",
                      "scorer_version": "1"}
              for i in range(len(TEXTS))]
    store.write_table(rollouts, "rollouts", tmp / "data" / "rollouts")
    store.write_table(scores, "scores", tmp / "data" / "scores")
    return tmp


@pytest.fixture(autouse=True)
def stage_env(monkeypatch):
    """The environment reliability.stage_env() gives a stage process: no progress bars, SECRET as the API key."""
    monkeypatch.setenv("TQDM_DISABLE", "1")
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)


def run_stage(workdir: Path, name: str) -> Ran:
    return stage("critique", ["--round", "0001", "--rollouts", "data/rollouts", "--scores", "data/scores",
                              "--tokenizer", "models/base", "--out", f"{name}/annotations",
                              "--metrics", f"{name}/critique.json"], workdir)


def expected_keys(workdir: Path) -> list[str]:
    """The cache key of each response's request, computed by the pipeline's own client (port-independent)."""
    critic = load_params(workdir / "params.yaml").critic
    template = load_template(workdir / critic.template)
    rows = scored_rows(store.read_table(workdir / "data" / "rollouts", "rollouts"),
                       store.read_table(workdir / "data" / "scores", "scores"))
    client = critic_client(critic, None, template_sha=template.sha256)
    requests = round_requests(rows, template=template, threshold=critic.threshold)
    return [client.key_for(messages) for messages in requests]


def cached_keys(workdir: Path) -> set[str]:
    with CriticCache(workdir / "cache") as cache:
        return set(cache.keys())


def assert_failed_cleanly(result: Ran, workdir: Path, name: str) -> str:
    """Exit 2, one stderr line (besides the progress bar), no annotations or metrics written; returns the line."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = [line for line in result.stderr.strip().splitlines()
             if not line.startswith("critic requests:")]  # the progress bar aside, one line
    assert len(lines) == 1, result.stderr
    assert not (workdir / name / "annotations").exists() and not (workdir / name / "critique.json").exists()
    return lines[0]


def test_failures_over_the_limit_stop_the_round_and_a_rerun_sends_only_them(tmp_path):
    port = free_port()
    workdir = make_round(tmp_path, port)
    keys = expected_keys(workdir)
    failing = {"Item02", "Item05", "Item07", "Item09"}  # 4 of 10 = 40% > 20%
    bad = {keys[i] for i, text in enumerate(TEXTS) if text[:6] in failing}

    backend = RecordingBackend(failing)
    with critic_server(port=port, backend=backend) as server:
        line = assert_failed_cleanly(run_stage(workdir, "run1"), workdir, "run1")
        assert server.stats()["requests"] == 6 + 4 * 2  # each failure tried twice (critic.max_retries 1)
    assert line == ("drlc: error: critique: 4 of 10 critiqued responses failed (40% > critic.max_error_rate 20%); "
                    "most common, 4 of them: http_500: Error code: 500 - backend failed: this request fails on "
                    "purpose; "
                    "every good answer is cached, re-run to retry only the failures")
    assert cached_keys(workdir) == set(keys) - bad  # the six good answers, no failure

    backend = RecordingBackend(failing)  # still failing: only the four are asked again
    with critic_server(port=port, backend=backend) as server:
        assert_failed_cleanly(run_stage(workdir, "run2"), workdir, "run2")
        assert server.stats()["requests"] == 4 * 2
    assert {m for m in failing if any(m in text for text in backend.seen)} == failing
    assert all(any(m in text for m in failing) for text in backend.seen)

    backend = RecordingBackend()  # fixed, and on another port: answers are keyed without host or port
    with critic_server(port=(other := free_port()), backend=backend) as server:
        raw = yaml.safe_load((workdir / "params.yaml").read_text())
        raw["critic"]["endpoint"] = f"http://127.0.0.1:{other}/v1"
        (workdir / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
        result = run_stage(workdir, "run3")
        assert result.returncode == 0, result.stderr
        assert server.stats()["requests"] == 4 and len(backend.seen) == 4
    assert all(any(marker in text for marker in failing) for text in backend.seen)
    metrics = json.loads((workdir / "run3" / "critique.json").read_text())
    assert {k: metrics[k] for k in ("critiqued", "critic_requests", "critic_retries", "critic_failures",
                                    "cache_hits", "status_ok", "status_api_error", "critic_error_rate")} == \
        {"critiqued": 10, "critic_requests": 4, "critic_retries": 0, "critic_failures": 0, "cache_hits": 6,
         "status_ok": 10, "status_api_error": 0, "critic_error_rate": 0.0}
    assert result.stdout.strip().splitlines()[-1] == \
        "critique: 10 critiqued, 4 requests sent (0 retries, 0 failed), 6 cache hits, $0.0000"
    rows = store.read_table(workdir / "run3" / "annotations", "annotations")
    assert [r["status"] for r in rows] == ["ok"] * 10 and cached_keys(workdir) == set(keys)


def test_failures_within_the_limit_are_recorded_and_counted_honestly(tmp_path):
    port = free_port()
    workdir = make_round(tmp_path, port)
    with critic_server(port=port, backend=RecordingBackend({"Item04"})) as server:  # 1 of 10 = 10% <= 20%
        result = run_stage(workdir, "run")
        received = server.stats()["requests"]
    assert result.returncode == 0, result.stderr
    metrics = json.loads((workdir / "run" / "critique.json").read_text())
    assert received == 9 + 2
    assert (metrics["critic_requests"], metrics["critic_retries"], metrics["critic_failures"]) == (received, 1, 1)
    assert (metrics["status_api_error"], metrics["status_ok"], metrics["critic_error_rate"]) == (1, 9, 0.1)
    assert set(metrics) >= {f"status_{s}" for s in ("ok", "none", "parse_error", "api_error", "truncated",
                                                   "skipped", "budget")} | {"critic_cost_usd", "intrinsic_reward_sum"}
    assert "critique: 10 critiqued, 11 requests sent (1 retries, 1 failed), 0 cache hits" in result.stdout


@pytest.mark.parametrize("dead", ["http_500", "connection_refused"])
def test_a_dead_endpoint_stops_the_round_with_one_line(tmp_path, dead):
    port = free_port()
    workdir = make_round(tmp_path, port)
    if dead == "http_500":
        with critic_server(port=port, error_rate=1.0) as server:
            line = assert_failed_cleanly(run_stage(workdir, "run"), workdir, "run")
            assert server.stats()["requests"] == 10 * 2
        assert "critique: 10 of 10 critiqued responses failed (100% > critic.max_error_rate 20%)" in line
        assert "most common, 10 of them: http_500: Error code: 500" in line and "injected server error" in line
        assert "server error; every good answer is cached, re-run to retry only the failures" in line
    else:  # nothing listens on the port: the first refused connect stops the stage, naming the URL
        started = time.monotonic()
        line = assert_failed_cleanly(run_stage(workdir, "run"), workdir, "run")
        assert time.monotonic() - started < 30  # no retry backoff (critic.max_retries 1)
        assert f"critic endpoint http://127.0.0.1:{port}/v1 is unreachable" in line
        assert "start the server there or fix critic.endpoint" in line
    assert cached_keys(workdir) == set()


def test_an_unresolvable_endpoint_host_stops_the_round_with_one_line(tmp_path):  # stage_env sets the API key
    workdir = make_round(tmp_path, free_port())
    raw = yaml.safe_load((workdir / "params.yaml").read_text())
    raw["critic"]["endpoint"] = "https://no-such-host.invalid/v1"  # .invalid never resolves (RFC 2606)
    (workdir / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    line = assert_failed_cleanly(run_stage(workdir, "run"), workdir, "run")
    assert "critic endpoint https://no-such-host.invalid/v1 is unreachable" in line


def annotation(status: str, error: str = "") -> dict:
    return {"critiqued": status != "skipped", "status": status, "error": error}


def test_check_health_groups_errors_and_names_what_to_do():
    rows = [annotation("ok")] * 5 + [annotation("truncated", "truncated (finish_reason=length)")] * 3 + \
        [annotation("parse_error", "no label line")] * 2 + [annotation("api_error", "timeout after 5s")] + \
        [annotation("skipped")] * 20
    with pytest.raises(CriticError) as failure:
        check_health(rows, max_error_rate=0.5)
    assert str(failure.value) == (
        "critique: 6 of 11 critiqued responses failed (55% > critic.max_error_rate 50%); most common, 3 of them: "
        "truncated (finish_reason=length); every good answer is cached, re-run to retry only the failures; raise "
        "critic.max_tokens (a truncated answer is cached under its max_tokens); parse errors come from cached answers: check "
        "critic.template and critic.model")
    check_health(rows, max_error_rate=6 / 11)  # at the limit passes
    check_health([annotation("skipped")] * 3, max_error_rate=0.0)  # nothing critiqued: nothing failed
