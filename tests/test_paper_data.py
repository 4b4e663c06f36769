"""Paper-profile data: save_to_disk folders and hub:<id> sources in the imdb / RealToxicityPrompts / TL;DR
schemas, the paper's filters (min_text_chars, min_prompt_toxicity), token-unit query prefixes, bad inputs."""
import dataclasses
import random

import pytest
from conftest import train_bpe
from datasets import Dataset, DatasetDict

from pipeline.core.config import WorldParams
from pipeline.core.errors import ConfigError, DataError
from pipeline.data.local import read_records
from pipeline.steps.prepare import prepare
from pipeline.tasks import get_task

WORDS = "the film was a quiet delight and every scene of the cast felt honest warm funny sad".split()


def review(draw: random.Random, n_words: int) -> str:
    return " ".join(draw.choice(WORDS) for _ in range(n_words)).capitalize() + ".<br /><br />The end."


@pytest.fixture(scope="module")
def imdb(tmp_path_factory):
    """A save_to_disk DatasetDict in imdb's schema (text, label): 30 long reviews, 10 short ones."""
    draw = random.Random(0)
    texts = [review(draw, 60) for _ in range(30)] + [review(draw, 5) for _ in range(10)]
    folder = tmp_path_factory.mktemp("imdb")
    DatasetDict({"train": Dataset.from_dict({"text": texts, "label": [i % 2 for i in range(40)]}),
                 "test": Dataset.from_dict({"text": texts[:12], "label": [0] * 12})}).save_to_disk(folder)
    return folder


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A pretrained-tokenizer stand-in (GPT-2-style BPE, pad = eos) saved like a hub model folder."""
    draw = random.Random(1)
    tokenizer = train_bpe([review(draw, 40) for _ in range(50)], vocab_size=290)  # few merges: words split
    tokenizer.pad_token = tokenizer.eos_token
    out = tmp_path_factory.mktemp("tok")
    tokenizer.save_pretrained(out)
    return str(out), tokenizer


def world(source, **kw) -> WorldParams:
    return dataclasses.replace(WorldParams(), source=str(source), **{"n_train_prompts": 8, "n_eval_prompts": 4, **kw})


def test_save_to_disk_folders_and_their_splits_are_read(imdb):
    assert len(read_records(str(imdb))) == 40  # DatasetDict: train by default
    assert len(read_records(f"{imdb}:test")) == 12
    single = imdb.parent / "single"
    Dataset.from_dict({"text": ["a", "b"]}).save_to_disk(single)
    assert read_records(str(single)) == [{"text": "a"}, {"text": "b"}]


def test_imdb_reviews_shorter_than_min_text_chars_are_dropped(imdb):
    corpus, _ = get_task("sentiment").build(world(imdb, min_text_chars=200), seed=0)
    long = [r for r in read_records(str(imdb)) if len(r["text"].replace("<br />", " ")) > 200]
    assert len(corpus) == len(long) == 30 and all(len(t) > 200 and "<br />" not in t for t in corpus)
    assert len(get_task("sentiment").build(world(imdb), seed=0)[0]) == 40  # min_text_chars 0 keeps them all


def test_token_prefixes_have_the_drawn_token_counts(imdb, tokenizer_dir):
    path, tokenizer = tokenizer_dir
    w = world(imdb, min_text_chars=200, prefix_unit="tokens", prefix_min_words=4, prefix_max_words=10)
    corpus, rows = prepare(task="sentiment", run_id="t", seed=0, world=w, base_model=path)
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]
    counts = []
    for row in rows:
        ids = encode(row["text"])
        source = next(r for r in corpus if r.startswith(row["text"]))  # a prefix of one of the kept reviews
        assert ids == encode(source)[:len(ids)]
        counts.append(len(ids))
    assert all(4 <= n <= 10 for n in counts) and len(set(counts)) > 2
    assert prepare(task="sentiment", run_id="t", seed=0, world=w, base_model=path) == (corpus, rows)
    # the same seeded draws of k give word prefixes of k words: the token prefixes have k tokens, fewer words
    words = prepare(task="sentiment", run_id="t", seed=0, world=dataclasses.replace(w, prefix_unit="words"))[1]
    assert [len(r["text"].split()) for r in words] == counts
    assert all(len(t["text"]) < len(w["text"]) for t, w in zip(rows, words))


def test_token_prefixes_need_a_pretrained_tokenizer_and_a_prefix_task(imdb, tokenizer_dir):
    w = world(imdb, prefix_unit="tokens")
    with pytest.raises(ConfigError, match=r"'world.prefix_unit' = 'tokens' needs a pretrained tokenizer.*base.model"):
        prepare(task="sentiment", run_id="t", seed=0, world=w)
    with pytest.raises(ConfigError, match=r"'world.prefix_unit' = 'tokens' is not supported by task 'summarization'"):
        prepare(task="summarization", run_id="t", seed=0, world=w, base_model=tokenizer_dir[0])
    with pytest.raises(ConfigError, match="needs review data"):
        prepare(task="sentiment", run_id="t", seed=0, world=dataclasses.replace(w, source="world"),
                base_model=tokenizer_dir[0])


@pytest.fixture(scope="module")
def rtp(tmp_path_factory):
    """A save_to_disk Dataset in RealToxicityPrompts' schema (nested prompt / continuation)."""
    toxicities = [0.9, 0.7, 0.61, 0.6, 0.2, 0.95, None, 0.65, 0.8, 0.99, 0.1, 0.75]
    rows = [{"filename": f"{i}.txt", "challenging": t is not None and t > 0.5,
             "prompt": {"text": f"prompt number {i}", "toxicity": t, "profanity": 0.1},
             "continuation": {"text": f" continues {i}", "toxicity": 0.2, "profanity": 0.1}}
            for i, t in enumerate(toxicities)]
    folder = tmp_path_factory.mktemp("rtp")
    Dataset.from_list(rows).save_to_disk(folder)
    return folder


def test_rtp_prompts_above_min_prompt_toxicity_are_kept(rtp):
    w = world(rtp, min_prompt_toxicity=0.6, n_train_prompts=20, n_eval_prompts=2)
    corpus, splits = get_task("toxicity").build(w, seed=0)
    kept = sorted(int(p["text"].split()[-1]) for s in splits.values() for p in s)
    assert kept == [0, 1, 2, 5, 7, 8, 9, 11]  # toxicity > 0.6 strictly; None dropped
    assert corpus[0] == "prompt number 0 continues 0" and len(corpus) == 12
    everything = get_task("toxicity").build(dataclasses.replace(w, min_prompt_toxicity=None), seed=0)[1]
    assert sum(len(s) for s in everything.values()) == 12


@pytest.fixture(scope="module")
def tldr(tmp_path_factory):
    """A save_to_disk DatasetDict in CarperAI/openai_summarize_tldr's schema (prompt, label)."""
    make = lambda n, tag: Dataset.from_dict({
        "prompt": [f"SUBREDDIT: r/{tag}\nTITLE: title {i}\nPOST: story {i} of {tag}\nTL;DR: " for i in range(n)],
        "label": [f"summary {i} of {tag}" for i in range(n)]})
    folder = tmp_path_factory.mktemp("tldr")
    DatasetDict({"train": make(10, "train"), "valid": make(6, "valid")}).save_to_disk(folder)
    return folder


def test_tldr_saved_dataset_gives_queries_ending_with_tldr_and_corpus_lines(tldr):
    corpus, rows = prepare(task="summarization", run_id="t", seed=0, world=world(tldr))
    assert all(r["text"].endswith("\nTL;DR:") and r["reference"].startswith("summary") for r in rows)
    assert all(line.endswith(f"TL;DR: summary {line.split()[-3]} of train") for line in corpus)
    _, valid = prepare(task="summarization", run_id="t", seed=0, world=world(f"{tldr}:valid", n_train_prompts=2))
    assert all(r["reference"].endswith("of valid") for r in valid)


# ---- bad inputs ----

def test_a_dataset_without_the_needed_column_names_the_source_and_the_fix(tmp_path):
    folder = tmp_path / "body"
    Dataset.from_dict({"body": ["x" * 300], "label": [1]}).save_to_disk(folder)
    with pytest.raises(DataError, match=r"body.*no review text column.*\['text', 'review'\].*\['body', 'label'\]"):
        get_task("sentiment").build(world(folder), seed=0)
    with pytest.raises(DataError, match=r"body.*'prompt.text'"):
        get_task("toxicity").build(world(folder), seed=0)
    with pytest.raises(DataError, match=r"body.*no document column"):
        get_task("summarization").build(world(folder), seed=0)


def test_an_empty_split_after_filtering_names_the_key_to_change(imdb, rtp):
    with pytest.raises(DataError, match=r"imdb.*no review longer than 5000 characters.*'world.min_text_chars'"):
        get_task("sentiment").build(world(imdb, min_text_chars=5000), seed=0)
    with pytest.raises(DataError, match=r"rtp.*prompt.toxicity > 0.995.*'world.min_prompt_toxicity'"):
        get_task("toxicity").build(world(rtp, min_prompt_toxicity=0.995), seed=0)
    with pytest.raises(DataError, match=r"5 usable prompts.*n_eval_prompts"):
        get_task("toxicity").build(world(rtp, min_prompt_toxicity=0.7, n_eval_prompts=6), seed=0)


def test_bad_saved_and_hub_sources_say_what_to_do(imdb, tmp_path, monkeypatch):
    with pytest.raises(DataError, match=r"no split 'validation'; its splits are \['test', 'train'\]"):
        read_records(f"{imdb}:validation")
    single = tmp_path / "single"
    Dataset.from_dict({"text": ["a"]}).save_to_disk(single)
    with pytest.raises(DataError, match="holds a single split"):
        read_records(f"{single}:train")
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(DataError, match=r"'hub:stanfordnlp/imdb:train'.*could not load split 'train'.*"
                                        r"save_to_disk\(DIR\).*'world.source' to DIR"):
        read_records("hub:stanfordnlp/imdb:train")
    with pytest.raises(DataError, match="names no dataset"):
        read_records("hub:")
    with pytest.raises(DataError, match=r"not found.*save_to_disk folder or hub:<dataset id>"):
        read_records(str(tmp_path / "missing"))
