"""Secrets and untrusted answers: the API key is never written; critic answers stay text.

The shrunken run (tests/reliability.py) ran the whole DAG with OPENAI_API_KEY set to a unique
random value and the critic on a loopback URL, so the client sent that key with every request.
Here every file of that project and the captured logs are scanned for the key, Parquet cells and
cache values decoded (compression could hide it from a byte scan). Then the client is pointed
at a server that echoes the Authorization header into its error body: the error is scrubbed.
Finally the critic answers paths, Python code, format fields and a huge span: all stay text.
"""
import http.server
import json
import threading

import pyarrow.parquet as pq
import pytest
from reliability import ROOT, SECRET, critic_server, shrunken_run
from transformers import AutoTokenizer

from pipeline.core.cache import CriticCache
from pipeline.critic.annotate import annotate_round
from pipeline.critic.client import CriticClient
from pipeline.critic.templates import load_template


def files_holding(root, needle: str) -> list[str]:
    """Files under root whose bytes, decoded Parquet cells or cache values contain needle."""
    hits = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        if needle.encode() in path.read_bytes():
            hits.append(str(path))
        elif path.suffix == ".parquet" and needle in json.dumps(pq.read_table(path).to_pylist(), default=str):
            hits.append(f"{path} (decoded)")
    return hits


@pytest.mark.slow  # shrunken_run() builds a project with dvc repro
def test_api_key_is_in_no_file_log_or_cache_value_of_a_run():
    run = shrunken_run()
    project = run["project"]
    scanned = {name: (project / name).exists() for name in ("data", "cache", "metrics", "models", "dvc.lock", ".dvc")}
    assert all(scanned.values()), scanned
    assert files_holding(project, SECRET) == []
    log = run["log"].read_text()
    assert "critique:" in log and SECRET not in log
    with CriticCache(project / "cache" / "critic") as cache:
        entries = [(key, cache.get(key)) for key in cache.keys()]
    assert entries and SECRET not in json.dumps(entries, default=str)
    assert SECRET not in (project / "params.yaml").read_text()
    print(f"\nscanned {sum(1 for p in project.rglob('*') if p.is_file())} files + {len(log)} log chars for the key")


class EchoAuthorization(http.server.BaseHTTPRequestHandler):
    """Answers 400 with the request's Authorization header in the error body (a leaky API)."""

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps({"error": {"message": f"bad key {self.headers['Authorization']}"}}).encode()
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_api_key_echoed_by_the_endpoint_is_scrubbed_from_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), EchoAuthorization)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = CriticClient(base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", model="m")
        assert SECRET not in repr(client)
        with CriticCache(tmp_path / "cache") as cache:
            [result] = client.run([[{"role": "user", "content": "hi"}]], cache)
            assert sum(1 for _ in cache.keys()) == 0
    finally:
        server.shutdown()
        server.server_close()
    assert result.status == "api_error" and "http_400" in result.error and "***" in result.error
    assert SECRET not in result.error


HOSTILE_SPANS = ["../../etc/passwd", "{__import__('os').system('touch PWNED')}", "{response}", "%s%n"]
HUGE_SPAN = "x" * 300_000


def hostile_answer(messages):
    quoted = "; ".join(f'"{span}"' for span in HOSTILE_SPANS)
    return f'Positive: {quoted}\nNegative: "{HUGE_SPAN}"'


@pytest.mark.slow  # shrunken_run() builds a project with dvc repro
def test_critic_answers_with_paths_code_and_huge_spans_are_only_text(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(shrunken_run()["project"] / "models" / "base")
    ids = tokenizer.encode(" ".join(["see"] + HOSTILE_SPANS + ["now"]))
    rows = [{"rollout_id": "r0", "response": tokenizer.decode(ids), "response_ids": ids, "env_reward": -1.0}]
    template = load_template(ROOT / "prompts" / "sentiment.md")
    [rendered] = [template.render({"response": rows[0]["response"]})]
    assert "{__import__('os').system('touch PWNED')}" in rendered[-1]["content"]  # filled in as text
    with critic_server(backend=hostile_answer) as server, CriticCache(tmp_path / "cache") as cache:
        client = CriticClient(base_url=server.base_url, model="m")
        [row] = annotate_round(rows, template=template, tokenizer=tokenizer, client=client, cache=cache,
                               threshold=0.0, rewards={"positive": 0.5, "negative": -0.5}, alignment="exact",
                               progress=False)
    assert row["status"] == "ok" and row["raw_text"] == hostile_answer([])
    texts = {span["text"]: span for span in row["spans"]}
    assert set(HOSTILE_SPANS) <= set(texts) and HUGE_SPAN not in texts
    # not in the response: recorded in `dropped` with its reason, never rewarded
    assert [(d["text"], d["reason"]) for d in row["dropped"]] == [(HUGE_SPAN, "not in the response")]
    assert sum(r > 0 for r in row["token_rewards"]) > 0 and min(row["token_rewards"]) >= 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]  # nothing created, PWNED included
