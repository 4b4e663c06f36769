"""The distilled span tagger: features, fit, determinism, `drlc critic distill`, and the tagger backend
served on loopback through the real client, cache and audit."""
import dataclasses
import json
import random
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.audit.critic_eval import audit_critic
from pipeline.audit.distill import data_sha256, distill, examples_from_run, split_examples
from pipeline.commands.cli import main
from pipeline.core.config import load_params
from pipeline.core.errors import CriticError, DataError
from pipeline.critic.offline.server import make_server, serve_in_background
from pipeline.critic.offline.tagger import MODEL_FILES, SpanTagger, TaggerConfig, token_classes, tokenize
from pipeline.critic.offline.tagger_backend import critiqued_text
from pipeline.critic.templates import load_template
from pipeline.steps.critique import critic_model_id
from tests.e2e import ROOT

INSULTS = ["idiot", "moron", "loser", "clown", "fool"]
NEUTRAL = ["the", "plan", "was", "late", "again", "we", "saw", "a", "movie", "today", "it", "rained", "and", "you"]


def synthetic(n: int, seed: int = 0) -> list[tuple[str, tuple]]:
    """Posts of neutral words, most with one insult: the insult is the gold toxic span."""
    rng = random.Random(seed)
    examples = []
    for _ in range(n):
        words = rng.sample(NEUTRAL, 6)
        spans = ()
        if rng.random() < 0.8:
            k = rng.randrange(len(words) + 1)
            words.insert(k, rng.choice(INSULTS))
            start = sum(len(w) + 1 for w in words[:k])
            spans = (("toxic", start, start + len(words[k])),)
        examples.append((" ".join(words), spans))
    return examples


SMALL = {"labels": ("toxic",), "max_iter": 50, "min_count": 1}


def test_tokens_and_their_classes_by_hand():
    text = "you f**k off, idiot's pal"
    tokens = tokenize(text)
    assert [text[s:e] for s, e in tokens] == ["you", "f**k", "off", ",", "idiot's", "pal"]
    # "f**k off" labelled, and 3 of the 7 characters of "idiot's": not more than half, so O
    assert token_classes(tokens, [("toxic", 4, 12), ("toxic", 14, 17)], ("toxic",)) == [0, 1, 1, 0, 0, 0]
    assert token_classes(tokens, [("b", 14, 18)], ("a", "b")) == [0, 0, 0, 0, 2, 0]


def test_fit_learns_the_insults_and_decodes_spans():
    tagger = SpanTagger.fit(synthetic(200), TaggerConfig(**SMALL))
    text = "we saw a moron today and you fool"
    assert tagger.spans(text) == [("toxic", 9, 14), ("toxic", 29, 33)]
    assert tagger.spans("we saw a movie today") == []
    assert tagger.spans("") == []


def test_adjacent_tokens_merge_across_whitespace_only():
    tagger = SpanTagger.fit(synthetic(200), TaggerConfig(**SMALL))
    assert tagger.spans("you idiot moron, fool") == [("toxic", 4, 15), ("toxic", 17, 21)]


def test_fallback_names_the_best_token_when_none_passes_the_threshold():
    tagger = SpanTagger.fit(synthetic(200), TaggerConfig(**SMALL))
    text = "we saw a movie today"
    tokens, probs = tagger.probabilities(text)
    best = int(probs[:, 1].argmax())
    assert tagger.spans(text, threshold=1.0, fallback=1e-9) == [("toxic", *tokens[best])]
    assert tagger.spans(text, threshold=1.0, fallback=0.0) == []


def test_same_data_and_settings_give_the_same_model_bytes(tmp_path):
    first = SpanTagger.fit(synthetic(150), TaggerConfig(**SMALL)).save(tmp_path / "a")
    second = SpanTagger.fit(synthetic(150), TaggerConfig(**SMALL)).save(tmp_path / "b")
    other = SpanTagger.fit(synthetic(150, seed=1), TaggerConfig(**SMALL)).save(tmp_path / "c")
    assert first == second != other
    for name in MODEL_FILES:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    loaded = SpanTagger.load(tmp_path / "a", labels=("toxic",))
    assert loaded.spans("you idiot") == [("toxic", 4, 9)]


def test_distill_card_and_byte_identical_folders(tmp_path):
    examples = synthetic(120)
    card = distill(examples, labels=("toxic",), out_dir=tmp_path / "m1", source="synthetic", seed=3,
                   max_iter=50, min_count=1)
    distill(examples, labels=("toxic",), out_dir=tmp_path / "m2", source="synthetic", seed=3,
            max_iter=50, min_count=1)
    for name in (*MODEL_FILES, "card.json"):
        assert (tmp_path / "m1" / name).read_bytes() == (tmp_path / "m2" / name).read_bytes()
    train, heldout = split_examples(examples, seed=3, heldout_share=0.15)
    assert (card["n_train"], card["n_heldout"], card["n_examples"]) == (len(train), len(heldout), 120) == (102, 18, 120)
    assert card["data_sha256"] == data_sha256(examples) != data_sha256(examples[1:])
    assert card["labels"] == ["toxic"] and card["n_spans"] == sum(len(s) for _, s in examples)
    assert card["heldout"]["n"] == 18 and card["heldout"]["char_f1"] > 0.9  # the insults are easy to learn
    assert json.loads((tmp_path / "m1" / "card.json").read_text())["model_hash"] == card["model_hash"]


def write_posts(path, examples):
    path.write_text("".join(json.dumps({"text": t, "spans": [{"label": lab, "start": s, "end": e}
                                                            for lab, s, e in spans]}) + "\n"
                            for t, spans in examples))
    return path


def tagger_critic(tmp_path, model_dir, **changes):
    critic = load_params(ROOT / "configs" / "demo-toxicity.yaml").critic
    return dataclasses.replace(critic, template=str(ROOT / "prompts" / "toxicity.md"), backend="tagger",
                               model_dir=str(model_dir), model="drlc-tagger", cache_dir=str(tmp_path / "cache"),
                               **changes)


def test_distil_serve_and_audit_through_the_real_server_then_replay_from_the_cache(tmp_path):
    card = distill(synthetic(200), labels=("toxic",), out_dir=tmp_path / "model", source="synthetic",
                   max_iter=50, min_count=1)
    posts = write_posts(tmp_path / "posts.jsonl", synthetic(30, seed=7))
    critic = tagger_critic(tmp_path, tmp_path / "model")
    _, first = audit_critic(spans_path=posts, critic=critic, references=False, progress=False)
    scores = first["critics"]["configured"]
    assert scores["requests_sent"] == 30 and scores["server_requests"] == 30
    assert scores["char_f1"] > 0.9 and scores["status_share"]["parse_error"] == 0
    _, again = audit_critic(spans_path=posts, critic=critic, references=False, progress=False)
    assert again["critics"]["configured"]["requests_sent"] == 0
    assert again["critics"]["configured"]["cache_hits"] == 30
    assert again["critics"]["configured"]["char_f1"] == scores["char_f1"]
    assert critic_model_id(critic) == f"drlc-local:tagger:{card['model_hash']}"


@pytest.mark.parametrize("answer_format", ["json", "copy"])
def test_structured_answers_name_the_same_spans_as_text_answers(tmp_path, answer_format):
    distill(synthetic(200), labels=("toxic",), out_dir=tmp_path / "model", source="s", max_iter=50, min_count=1)
    posts = write_posts(tmp_path / "posts.jsonl", synthetic(20, seed=3))
    _, text = audit_critic(spans_path=posts, critic=tagger_critic(tmp_path / "t", tmp_path / "model"),
                           references=False, progress=False)
    critic = tagger_critic(tmp_path / "s", tmp_path / "model", answer_format=answer_format)
    _, structured = audit_critic(spans_path=posts, critic=critic, references=False, progress=False)
    text, structured = text["critics"]["configured"], structured["critics"]["configured"]
    assert structured["requests_sent"] == 20 and structured["status_share"]["parse_error"] == 0
    assert structured["char_f1"] == text["char_f1"] > 0.9


def test_served_answers_are_in_the_template_format_and_batched(tmp_path):
    distill(synthetic(200), labels=("toxic",), out_dir=tmp_path / "model", source="s", max_iter=50, min_count=1)
    template = load_template(str(ROOT / "prompts" / "toxicity.md"), task="toxicity")
    messages = template.render({"response": 'we saw "idiot" and a moron'})
    assert critiqued_text(messages) == 'we saw "idiot" and a moron'
    server = make_server(backend="tagger", model_dir=str(tmp_path / "model"), labels=("toxic",))
    answer = server.complete_fn({"messages": messages})
    server.server_close()
    assert answer.text == 'Toxic: "idiot"; "moron"'
    assert answer.completion_tokens == 3
    texts = [f"we saw a {word} today" for word in INSULTS * 2]
    backend = server.complete_fn
    with serve_in_background(backend="tagger", model_dir=str(tmp_path / "model")) as (url, stats):
        with ThreadPoolExecutor(8) as pool:
            bodies = list(pool.map(lambda t: _chat(url, template.render({"response": t})), texts))
        assert stats()["completions"] == 10
    assert [b["choices"][0]["message"]["content"] for b in bodies] == [f'Toxic: "{w}"' for w in INSULTS * 2]
    assert backend.batch_sizes == [1]  # the unbatched call above; the served backend is its own


def _chat(url, messages):
    request = urllib.request.Request(f"{url}/chat/completions", data=json.dumps({"messages": messages}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_missing_and_incompatible_model_folders_are_one_line_errors(tmp_path):
    with pytest.raises(CriticError) as missing:
        make_server(backend="tagger", model_dir=str(tmp_path / "nowhere"), labels=("toxic",))
    message = str(missing.value)
    assert "\n" not in message and str(tmp_path / "nowhere") in message and "['toxic']" in message
    SpanTagger.fit(synthetic(50), TaggerConfig(**SMALL)).save(tmp_path / "tox")
    with pytest.raises(CriticError) as other:
        make_server(backend="tagger", model_dir=str(tmp_path / "tox"), labels=("positive", "negative"))
    message = str(other.value)
    assert "\n" not in message and str(tmp_path / "tox") in message and "['positive', 'negative']" in message
    (tmp_path / "tox" / "weights.npy").write_bytes(b"not numpy")
    with pytest.raises(CriticError, match="unreadable tagger"):
        make_server(backend="tagger", model_dir=str(tmp_path / "tox"), labels=("toxic",))
    with pytest.raises(CriticError, match="needs model_dir"):
        make_server(backend="tagger")
    with pytest.raises(CriticError, match="needs critic.model_dir"):
        critic_model_id(dataclasses.replace(tagger_critic(tmp_path, "x"), model_dir=None))
    with pytest.raises(CriticError, match="weights.npy, features.json, config.json missing"):
        critic_model_id(tagger_critic(tmp_path, tmp_path / "nowhere"))


def write_run(data, rows):
    """A run's annotations and rollouts tables, with only the columns the distill query reads."""
    for table, columns in (("rollouts", ("round", "rollout_id", "response")),
                           ("annotations", ("round", "rollout_id", "status", "spans"))):
        folder = data / table / "round=0001"
        folder.mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist([{c: r[c] for c in columns} for r in rows]), folder / "part-0.parquet")


def test_examples_from_a_run_keep_read_answers_and_found_spans(tmp_path):
    span = {"label": "toxic", "text": "idiot", "start": 4, "end": 9, "reward": -1.0}
    lost = {"label": "toxic", "text": "moron", "start": -1, "end": -1, "reward": -1.0}
    write_run(tmp_path / "data", [
        {"round": 1, "rollout_id": 0, "response": "you idiot", "status": "ok", "spans": [span, lost]},
        {"round": 1, "rollout_id": 1, "response": "nice day", "status": "none", "spans": []},
        {"round": 1, "rollout_id": 2, "response": "oops", "status": "api_error", "spans": []},
    ])
    assert examples_from_run(tmp_path / "data", labels=("toxic",)) == [
        ("you idiot", (("toxic", 4, 9),)), ("nice day", ())]
    only = examples_from_run(tmp_path / "data", labels=("toxic",),
                             query="SELECT r.response AS text, a.spans AS spans FROM annotations a JOIN rollouts r "
                                   "USING (round, rollout_id) WHERE a.status = 'none'")
    assert only == [("nice day", ())]
    with pytest.raises(DataError, match="no column"):
        examples_from_run(tmp_path / "data", labels=("toxic",), query="SELECT 1 AS x")
    with pytest.raises(DataError, match="holds no annotations"):
        examples_from_run(tmp_path / "empty", labels=("toxic",))


def test_cli_distill_from_a_span_file_and_its_errors(tmp_path, capsys):
    posts = write_posts(tmp_path / "train.jsonl", synthetic(120))
    params = str(ROOT / "configs" / "demo-toxicity.yaml")
    main(["critic", "distill", "--params", params, "--set", f"critic.template={ROOT / 'prompts' / 'toxicity.md'}",
          "--spans", str(posts), "--out", str(tmp_path / "m")])
    out = capsys.readouterr().out
    assert "distilled a tagger for ['toxic'] from 102 texts" in out
    assert json.loads((tmp_path / "m" / "card.json").read_text())["source"] == str(posts)
    with pytest.raises(SystemExit):
        main(["critic", "distill", "--params", params, "--out", str(tmp_path / "n")])
    assert "exactly one source" in capsys.readouterr().err
