"""`drlc view` in a real headless Debian chromium, driven over the DevTools protocol: the page loads with no
console error, the spans it shows are the annotations table's, a filter changes what is shown, the
env-reward toggle changes a token's shading, the KL part shown per token is the kl_rewards table's (and its toggle
removes exactly it), and a screenshot is written (reports/test_artifacts/view.png).
"""
import base64
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import train_bpe

from pipeline.commands.report import write_report
from pipeline.commands.view import write_view
from pipeline.core import store

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACT = ROOT / "reports" / "test_artifacts" / "view.png"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-port=0", "--window-size=1200,1600"]
TEXTS = ["The food was awful and the staff rude.", "A lovely quiet place, great coffee.",
         "Terrible service, cold soup, bad bread.", "Fine view but dreadful noise all night."]

websocket = pytest.importorskip("websocket", reason="the `test` extra's websocket-client drives chromium")
pytestmark = pytest.mark.skipif(not Path(CHROMIUM).is_file(),
                                reason="Debian's chromium is not installed (apt-get install -y chromium; .ci/run does)")


def span(text, response, label, reward):
    start = response.index(text)
    return {"label": label, "text": text, "start": start, "end": start + len(text), "reward": reward}


def make_run(run: Path, rounds=(1, 2), kl_rounds=()) -> list[dict]:
    """data/{rollouts,scores,annotations} of a small finished run and its models/base tokenizer; the rounds in
    kl_rounds also get a kl_rewards partition (as their ppo stage writes it)."""
    tokenizer = train_bpe(TEXTS * 5)
    tokenizer.save_pretrained(str(run / "models" / "base"))
    annotations = []
    for round_ in rounds:
        keys = {"run_id": "view", "round": round_}
        rollouts, scores, rows = [], [], []
        for i, text in enumerate(TEXTS):
            rid, ids = f"r{round_}-{i}", tokenizer.encode(text)
            rollouts.append(keys | {"rollout_id": rid, "prompt_id": f"p{i}", "query": text.split()[0],
                                    "response": text, "query_ids": [], "response_ids": ids,
                                    "behaviour_logprobs": [0.0] * len(ids), "seed": 0, "max_new_tokens": 20,
                                    "policy": "base"})
            scores.append(keys | {"rollout_id": rid, "env_reward": [-0.8, 0.9, -0.6, -0.2][i] * round_,
                                  "env_reward_shaped": [-0.8, 0.9, -0.6, -0.2][i] * round_, "scorer": "vader",
                                  "scorer_version": "1"})
            marked = {0: [("awful", "negative", -0.5), ("rude", "negative", -0.5)], 2: [("Terrible", "negative", -0.5)],
                      3: [("Fine view", "positive", 0.5)]}.get(i, [])
            spans = [span(t, text, label, reward) for t, label, reward in marked]
            status = "ok" if spans else "none"
            dropped = [{"label": "negative", "text": "soggy", "reason": "not in the response"}] if i == 2 else []
            rewards = [(-0.5 if any(s["label"] == "negative" for s in spans) else 0.5) if j == 1 and spans else 0.0
                       for j in range(len(ids))]
            rows.append(keys | {"rollout_id": rid, "critiqued": i != 1 or round_ == 1, "status": status,
                                "cache_key": f"k{i}", "cache_hit": round_ == 2, "critic_model": "m",
                                "template_sha": "s", "raw_text": f"answer {i}\nNEGATIVE: awful", "items": [],
                                "spans": spans, "dropped": dropped, "token_rewards": rewards, "prompt_tokens": 9,
                                "completion_tokens": 3, "cost_usd": 0.0, "attempts": int(round_ == 1), "error": ""})
        kl = [keys | {"rollout_id": r["rollout_id"], "algorithm": "ppo", "kl_penalty": "kl", "kl_coef": 0.2,
                      "kl_reward": [-0.01 * (j + 1) * (i + 1) for j in range(len(r["response_ids"]))]}
              for i, r in enumerate(rollouts)]
        tables = (("rollouts", rollouts), ("scores", scores), ("annotations", rows)) + \
            ((("kl_rewards", kl),) if round_ in kl_rounds else ())
        for table, data in tables:
            store.write_table(data, table, store.partition_dir(run / "data", table, round_))
        annotations += rows
    return annotations


class Browser:
    """One headless chromium and a DevTools-protocol connection to its page; console errors are collected."""

    def __init__(self, profile: Path):
        self.proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.is_file() or not port_file.read_text().strip():
            assert time.monotonic() < deadline and self.proc.poll() is None, "chromium did not start"
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        pages = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10).read())
        url = next(p["webSocketDebuggerUrl"] for p in pages if p["type"] == "page")
        self.ws = websocket.create_connection(url, timeout=30, suppress_origin=True)
        self.next_id, self.errors, self.events = 0, [], []
        for method in ("Runtime.enable", "Log.enable", "Page.enable"):
            self.call(method)

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                assert "error" not in message, message
                return message.get("result", {})
            self._event(message)

    def _event(self, message: dict) -> None:
        method, params = message.get("method"), message.get("params", {})
        self.events.append(method)
        if method == "Runtime.exceptionThrown":
            self.errors.append(params["exceptionDetails"].get("text", "exception"))
        elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
            self.errors.append(str(params["args"]))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            self.errors.append(params["entry"]["text"])

    def load(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        while "Page.loadEventFired" not in self.events:
            self._event(json.loads(self.ws.recv()))

    def js(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def close(self) -> None:
        self.ws.close()
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.fixture
def browser(tmp_path):
    opened = Browser(tmp_path / "chromium-profile")
    yield opened
    opened.close()


SHOWN_SPANS = """[...document.querySelectorAll('.row')].map(r => [r.dataset.id,
  [...r.querySelectorAll('li.span')].map(li => [li.dataset.label, li.dataset.text, +li.dataset.start, +li.dataset.end])])"""


@pytest.mark.slow  # a headless chromium process
def test_view_page_in_headless_chromium(tmp_path, browser):
    run = tmp_path / "run"
    annotations = make_run(run)
    page = write_view(run)
    assert page == run / "reports" / "view.html"
    assert "http://" not in page.read_text() and "https://" not in page.read_text()  # nothing to fetch
    browser.load(page.as_uri())
    assert browser.errors == []
    critiqued = sorted((a for a in annotations if a["critiqued"]), key=lambda a: (a["round"], a["rollout_id"]))
    expected = [[a["rollout_id"], [[s["label"], s["text"], s["start"], s["end"]] for s in a["spans"]]]
                for a in critiqued]
    assert browser.js(SHOWN_SPANS) == expected  # every critiqued row on one page (7 < 25), the table's spans
    assert browser.js("document.getElementById('count').textContent") == "7 of 7 critiqued responses"
    summary = browser.js("[...document.querySelectorAll('#summary tr')].map(r => r.cells[0].textContent + ':' + r.cells[1].textContent)")
    assert summary == ["round:critiqued", "1:4", "2:3"]

    browser.js("const f = document.getElementById('f-label'); f.value = 'positive'; f.dispatchEvent(new Event('change'))")
    assert browser.js("[...document.querySelectorAll('.row')].map(r => r.dataset.id)") == ["r1-3", "r2-3"]
    browser.js("const g = document.getElementById('f-round'); g.value = '2'; g.dispatchEvent(new Event('change'))")
    assert browser.js("[...document.querySelectorAll('.row')].map(r => r.dataset.id)") == ["r2-3"]

    last = "(() => { const t = document.querySelectorAll('.row .tok'); return +t[t.length - 1].dataset.reward; })()"
    assert browser.js(last) == pytest.approx(-0.4)  # env reward -0.2 x round 2 on the last token
    browser.js("const e = document.getElementById('t-env'); e.checked = false; e.dispatchEvent(new Event('change'))")
    assert browser.js(last) == 0.0
    assert browser.errors == []

    shot = base64.b64decode(browser.call("Page.captureScreenshot", format="png")["data"])
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 5000
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    ARTIFACT.write_bytes(shot)


@pytest.mark.slow  # a headless chromium process
def test_pages_of_thousands_of_rows_render_25_at_a_time(tmp_path, browser):
    from pipeline.commands.view import render_page

    rows = [{"round": 1 + i // 1000, "id": f"r{i:05d}", "query": "q", "response": "a b", "tokens": ["a", " b"],
             "env": (i % 7) / 7 - 0.5, "status": "ok" if i % 3 else "none", "raw": "x", "critic": [-0.5, 0.0],
             "error": "", "spans": [{"label": "negative", "text": "a", "start": 0, "end": 1, "reward": -0.5}],
             "dropped": [], "cache_hit": False, "attempts": 1} for i in range(3000)]
    page = tmp_path / "big.html"
    page.write_text(render_page(rows, title="big"), encoding="utf-8")
    started = time.monotonic()
    browser.load(page.as_uri())
    assert time.monotonic() - started < 20
    assert browser.errors == []
    assert browser.js("document.querySelectorAll('.row').length") == 25
    assert browser.js("document.getElementById('pager').textContent").endswith("page 1 of 120next")
    browser.js("document.getElementById('next').click()")
    assert browser.js("document.querySelector('.row').dataset.id") == "r00025"


def test_report_links_the_view_page(tmp_path):
    run = tmp_path / "run"
    (run / "metrics").mkdir(parents=True)
    curve = {"round": 1, "env_reward_mean": 0.1, "intrinsic_reward_sum": 0.1, "kl": 0.01, "kl_coef": 0.2, "critiqued": 4,
             "critic_requests": 4, "cache_hits": 0, "cache_hit_rate": 0.0, "critic_cost_usd": 0.0,
             "critic_cost_usd_total": 0.0}
    (run / "metrics" / "rounds.json").write_text(json.dumps({"rounds": [curve]}))
    text = write_report([str(run)], str(tmp_path / "out"))["markdown"].read_text()
    assert f"no page yet; run `drlc view {run}`" in text
    make_run(run, rounds=(1,))
    write_view(run)
    text = write_report([str(run)], str(tmp_path / "out"))["markdown"].read_text()
    assert "[view.html](../run/reports/view.html)" in text


TOKENS = """Object.fromEntries([...document.querySelectorAll('.row')].map(r => [r.dataset.id,
  [...r.querySelectorAll('.tok')].map(t => [t.dataset.kl === undefined ? null : +t.dataset.kl, +t.dataset.reward])]))"""


@pytest.mark.slow  # a headless chromium process
def test_kl_penalty_shading_is_the_kl_rewards_table_and_its_toggle_removes_it(tmp_path, browser):
    run = tmp_path / "run"
    annotations = make_run(run, kl_rounds=(1,))  # round 2's ppo stage has not run: no KL part there
    table = store.read_table(store.partition_dir(run / "data", "kl_rewards", 1), "kl_rewards")
    stored = {r["rollout_id"]: r["kl_reward"] for r in table}
    browser.load(write_view(run).as_uri())
    assert browser.errors == []
    with_kl = browser.js(TOKENS)
    critiqued = {a["rollout_id"]: a for a in annotations if a["critiqued"]}
    assert set(with_kl) == set(critiqued)
    for rid, tokens in with_kl.items():
        shown_kl = [kl for kl, _ in tokens]
        assert shown_kl == (pytest.approx(stored[rid]) if rid.startswith("r1-") else [None] * len(tokens))
    browser.js("const k = document.getElementById('t-kl'); k.checked = false; k.dispatchEvent(new Event('change'))")
    without_kl = browser.js(TOKENS)
    for rid, tokens in with_kl.items():
        kl = stored[rid] if rid.startswith("r1-") else [0.0] * len(tokens)
        assert [r for _, r in tokens] == pytest.approx([r + k for (_, r), k in zip(without_kl[rid], kl)], abs=2e-6)
        assert [r for _, r in without_kl[rid]] == pytest.approx(
            [c + (critiqued_env(critiqued[rid], run) if j == len(tokens) - 1 else 0.0)
             for j, c in enumerate(critiqued[rid]["token_rewards"])], abs=2e-6)
    meta = browser.js("[...document.querySelectorAll('.row .meta')].map(m => m.textContent)")
    assert any("ppo: -beta*KL per token" in m for m in meta)
    assert any("no KL stored for this round" in m for m in meta)
    summary = browser.js("[...document.querySelectorAll('#summary tr')].map(r => r.cells[7].textContent)")
    assert summary == ["KL reward sum", f"{sum(sum(stored[r]) for r in stored if r in critiqued):.4f}", "n/a"]
    assert browser.errors == []


def critiqued_env(annotation: dict, run: Path) -> float:
    scores = store.read_table(store.partition_dir(run / "data", "scores", annotation["round"]), "scores")
    return next(s["env_reward"] for s in scores if s["rollout_id"] == annotation["rollout_id"])
