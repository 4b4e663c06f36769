"""`drlc critic eval` through real HTTP servers: scores, statuses, request counts, the table and the CLI."""
import dataclasses
import json

import pytest
import yaml

from pipeline.audit.critic_eval import audit_critic, read_answer, write_audit
from pipeline.commands.cli import main
from pipeline.core import store
from pipeline.core.config import load_params
from pipeline.critic.offline.server import serve_in_background
from pipeline.critic.templates import load_template
from tests.e2e import ROOT

POSTS = [  # text, gold spans (start, end), what the scripted critic answers
    ("you are a dumb idiot ok", [(10, 14), (15, 20)], 'Toxic: "idiot ok"; "moron"'),  # moron is absent
    ("what a lovely day", [], "Toxic: none"),
    ("shut up, loser", [(9, 14)], "I would rather not label this text."),  # parse error
    ("the plan is bad", [], 'Toxic: "bad"'),
]


def write_posts(path, posts=POSTS):
    lines = [json.dumps({"text": text, "spans": [{"start": s, "end": e, "label": "toxic"} for s, e in gold]})
             for text, gold, _ in posts]
    path.write_text("\n".join(lines) + "\n")
    return path


def toxicity_critic(tmp_path, **changes):
    critic = load_params(ROOT / "configs" / "demo-toxicity.yaml").critic
    return dataclasses.replace(critic, template=str(ROOT / "prompts" / "toxicity.md"),
                               cache_dir=str(tmp_path / "cache"), **changes)


def scripted(messages):
    """An LLM stand-in with varied layouts: the answer scripted for the post in the prompt."""
    user = messages[-1]["content"]
    return next(answer for text, _, answer in POSTS if f"<response>\n{text}\n</response>" in user)


def test_scores_statuses_and_a_rerun_sends_nothing(tmp_path):
    spans = write_posts(tmp_path / "posts.jsonl")
    with serve_in_background(backend=scripted) as (url, server_stats):
        critic = toxicity_critic(tmp_path, endpoint=url, model="scripted")
        rows, summary = audit_critic(spans_path=spans, critic=critic, train_path=spans, progress=False)
        assert server_stats()["requests"] == 4
        again_rows, again = audit_critic(spans_path=spans, critic=critic, train_path=spans, progress=False)
        assert server_stats()["requests"] == 4  # the re-run is answered from the cache
    configured = summary["critics"]["configured"]
    # post 1: 2*5/(8+9); post 2: none vs none = 1; post 3: parse error, gold present = 0; post 4: 0
    assert configured["char_f1"] == pytest.approx((10 / 17 + 1 + 0 + 0) / 4)
    assert configured["status_share"]["ok"] == 0.5 and configured["status_share"]["none"] == 0.25
    assert configured["status_share"]["parse_error"] == 0.25
    assert configured["absent_span_share"] == pytest.approx(1 / 3)  # moron of (idiot ok, moron, bad)
    assert configured["span_precision"] == pytest.approx(1 / 2) and configured["span_recall"] == pytest.approx(1 / 3)
    assert configured["requests_sent"] == 4 and configured["cache_hits"] == 0
    assert again["critics"]["configured"]["requests_sent"] == 0 and again["critics"]["configured"]["cache_hits"] == 4
    assert summary["critics"]["lexicon"]["requests_sent"] == 4 and summary["critics"]["lexicon"]["server_requests"] == 4
    assert again["critics"]["lexicon"]["requests_sent"] == 0 and again["critics"]["lexicon"]["server_requests"] == 0
    assert all(r["cache_hit"] for r in again_rows if r["critic"] in ("configured", "lexicon"))
    assert [dict(r, cache_hit=None) for r in again_rows] == [dict(r, cache_hit=None) for r in rows]
    assert again["critics"] == {
        name: dict(c, requests_sent=0, server_requests=0, cache_hits=c["cache_hits"] + c["requests_sent"])
        for name, c in summary["critics"].items()}
    assert set(summary["critics"]) == {"configured", "lexicon", "everything", "nothing", "wordlist"}
    assert summary["wordlist_in_sample"] is True
    assert summary["critics"]["nothing"]["char_f1"] == pytest.approx(2 / 4)  # the two posts without gold


def test_lexicon_reference_and_the_catalog_view(tmp_path):
    spans = write_posts(tmp_path / "posts.jsonl")
    critic = toxicity_critic(tmp_path)  # the local lexicon critic itself
    rows, summary = audit_critic(spans_path=spans, critic=critic, progress=False, audit="lex")
    assert summary["lexicon_is_configured"] and "lexicon" not in summary["critics"]
    assert "wordlist" not in summary["critics"]  # no train split given
    lexicon = {r["line"]: r for r in rows if r["critic"] == "configured"}
    # the lexicon names dumb, idiot, shut up and loser; each one is located where it stands
    assert [(s["start"], s["end"]) for s in lexicon[1]["pred_spans"]] == [(10, 14), (15, 20)]
    assert lexicon[1]["char_f1"] == 1.0 and lexicon[2]["status"] == "none"
    paths = write_audit(rows, summary, data_dir=tmp_path / "data", out_dir=tmp_path / "out")
    con = store.connect(tmp_path / "data")
    got = con.sql("SELECT critic, count(*), avg(char_f1) FROM critic_eval WHERE audit = 'lex' "
                  "GROUP BY 1 ORDER BY 1").fetchall()
    assert got == [(name, 4, pytest.approx(summary["critics"][name]["char_f1"]))
                   for name in ("configured", "everything", "nothing")]
    assert json.loads(paths["summary"].read_text())["critics"]["configured"]["char_f1"] == \
        summary["critics"]["configured"]["char_f1"]
    # posts 1, 2 and 4 score 1 ("bad" is no lexicon term); post 3: "shut up" + "loser" vs "loser" = 2*5/(12+5)
    assert summary["critics"]["configured"]["char_f1"] == pytest.approx((3 + 10 / 17) / 4)
    assert "| configured | drlc-lexicon | 0.897 |" in paths["report"].read_text()


def test_sentiment_labels_through_the_lexicon(tmp_path):
    spans = tmp_path / "sentiment.jsonl"
    spans.write_text(json.dumps({"text": "a good film with a bad end", "spans": [
        {"start": 2, "end": 6, "label": "positive"}, {"start": 19, "end": 22, "label": "negative"}]}) + "\n")
    critic = dataclasses.replace(load_params(ROOT / "params.yaml").critic,
                                 template=str(ROOT / "prompts" / "sentiment.md"), cache_dir=str(tmp_path / "c"))
    rows, summary = audit_critic(spans_path=spans, critic=critic, references=False, progress=False)
    assert set(summary["critics"]) == {"configured"}
    assert summary["critics"]["configured"]["char_f1"] == 1.0
    assert {(s["label"], s["start"]) for s in rows[0]["pred_spans"]} == {("positive", 2), ("negative", 19)}


def test_read_answer_is_the_one_adapter():
    template = load_template(ROOT / "prompts" / "toxicity.md")
    reading = read_answer('Toxic: "idiot"; "clown"', "idiot, idiot!", template=template)
    assert reading.spans == (("toxic", 0, 5), ("toxic", 7, 12)) and (reading.proposed, reading.absent) == (2, 1)
    assert read_answer("Toxic: none", "x", template=template).status == "none"
    assert read_answer("no idea", "x", template=template).status == "parse_error"


def test_cli_writes_outputs_and_fails_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    params = yaml.safe_load((ROOT / "configs" / "demo-toxicity.yaml").read_text())
    params["critic"].update(template=str(ROOT / "prompts" / "toxicity.md"), cache_dir="cache")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    write_posts(tmp_path / "posts.jsonl")
    main(["critic", "eval", "--spans", "posts.jsonl", "--limit", "3", "--seed", "1"])
    assert "critic eval posts-drlc-lexicon: 3 posts" in capsys.readouterr().out
    assert (tmp_path / "reports/critic_eval/posts-drlc-lexicon/report.md").is_file()
    assert (tmp_path / "data/critic_eval/audit=posts-drlc-lexicon/part-0.parquet").is_file()
    (tmp_path / "bad.jsonl").write_text('{"text": "hi", "spans": []}\n{"text": "hi"}\n')
    with pytest.raises(SystemExit) as exit_info:
        main(["critic", "eval", "--spans", "bad.jsonl"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert "bad.jsonl:2: missing key(s) ['spans']" in err


def test_report_shows_every_status_column_and_the_shares_sum_to_one():
    from pipeline.audit.critic_eval import STATUSES
    from pipeline.audit.report import render_report

    shares = {"ok": 0.25, "none": 0.05, "no_match": 0.2, "parse_error": 0.0, "api_error": 0.05, "truncated": 0.45}
    critic = {"critic_model": "m", "char_f1": 0.1, "span_precision": 0.2, "span_recall": 0.3,
              "status_share": {s: shares[s] for s in STATUSES}, "absent_span_share": 0.5,
              "requests_sent": 20, "cache_hits": 0, "cost_usd": 0.0}
    summary = {"audit": "a", "seed": 0, "limit": 20, "n_posts": 20, "n_posts_with_gold": 18,
               "spans_file": "s.csv", "template": "t.md", "template_sha": "0" * 64, "critic_endpoint": "local:hf",
               "train_file": None, "span_match": "same label and IoU >= 0.5", "critics": {"configured": critic},
               "lexicon_is_configured": False}
    table = [line for line in render_report(summary).splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in table[0].strip("|").split("|")]
    row = [cell.strip() for cell in table[2].strip("|").split("|")]
    assert [s.replace("_", " ") for s in STATUSES] == header[5:5 + len(STATUSES)]
    assert len(header) == len(row) and sum(float(x) for x in row[5:5 + len(STATUSES)]) == pytest.approx(1.0)
    assert row[header.index("truncated")] == "0.45" and row[header.index("no match")] == "0.20"
