"""Task builders on local data, paper-profile builders on tiny hub-format fixtures, HF classifier rewards,
critic fields, and the bad inputs each one must reject with a clear message."""
import dataclasses
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from transformers import AutoTokenizer, DistilBertConfig, DistilBertForSequenceClassification

from pipeline.core.config import ScoreParams, WorldParams, load_params, params_from_dict
from pipeline.core.errors import ConfigError, DataError
from pipeline.critic.annotate import round_requests
from pipeline.critic.templates import load_template
from pipeline.model.pretrain import train_tokenizer
from pipeline.steps.prepare import prepare
from pipeline.steps.score import score
from pipeline.tasks import check_params, get_task, task_names

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
LONG = "This film was a quiet delight from start to finish, and the cast made every scene count. " * 3


def world(source, **kw) -> WorldParams:
    """The paper's filters (reviews > 200 chars, prompts > 0.6 toxicity) unless a test overrides them."""
    return dataclasses.replace(WorldParams(), source=str(source), n_train_prompts=4, n_eval_prompts=2,
                               **{"min_text_chars": 200, "min_prompt_toxicity": 0.6, **kw})


def test_tasks_are_the_modules_and_each_has_the_interface():
    assert task_names() == ("sentiment", "summarization", "toxicity")
    for name in task_names():
        task = get_task(name)
        for attribute in ("SCORERS", "build", "make_reward", "critic_fields", "make_evaluator"):
            assert hasattr(task, attribute), (name, attribute)
    with pytest.raises(ConfigError, match="poetry"):
        get_task("poetry")


def test_a_scorer_of_another_task_is_rejected():
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["score"]["scorer"] = "rouge1"
    with pytest.raises(ConfigError, match=r"'score.scorer' = 'rouge1'.*'vader', 'hf_classifier'"):
        check_params(params_from_dict(raw))


@pytest.mark.parametrize("profile", ["demo-toxicity", "demo-summarization", "local-sentiment", "local-toxicity",
                                     "local-summarization"])
def test_profiles_load_and_list_the_same_keys_as_params_yaml(profile):
    demo, raw = (yaml.safe_load(p.read_text()) for p in (ROOT / "params.yaml", ROOT / f"configs/{profile}.yaml"))
    assert {s: set(v) for s, v in raw.items()} == {s: set(v) for s, v in demo.items()}
    params = load_params(ROOT / f"configs/{profile}.yaml")
    assert load_template(ROOT / params.critic.template).task == params.run.task


# ---- paper builders on tiny hub-format fixtures ----

def test_imdb_hub_schema_queries_are_4_to_10_words_of_long_reviews(tmp_path):
    folder = tmp_path / "imdb"
    folder.mkdir()
    texts = [f"Review {i}. {LONG}<br />More." for i in range(8)] + ["Too short."]
    pq.write_table(pa.table({"text": texts, "label": [1] * 9}), folder / "train-00000-of-00001.parquet")
    corpus, splits = get_task("sentiment").build(world(folder, prefix_min_words=4, prefix_max_words=10), seed=0)
    assert len(corpus) == 8 and all("<br />" not in t for t in corpus)
    assert len(splits["eval"]) == 2 and len(splits["train"]) == 4
    lengths = [len(p["text"].split()) for s in splits.values() for p in s]
    assert all(4 <= n <= 10 for n in lengths) and len(set(lengths)) > 1
    again = get_task("sentiment").build(world(folder, prefix_min_words=4, prefix_max_words=10), seed=0)
    assert again == (corpus, splits)


def test_rtp_hub_schema_keeps_prompts_above_0_6_toxicity(tmp_path):
    rows = [{"prompt": {"text": f"prompt {i}", "toxicity": t}, "continuation": {"text": f" cont {i}"}}
            for i, t in enumerate([0.9, 0.7, 0.61, 0.6, 0.2, 0.95, None])]
    path = tmp_path / "rtp.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    corpus, splits = get_task("toxicity").build(world(path), seed=0)
    kept = sorted(p["text"] for s in splits.values() for p in s)
    assert kept == ["prompt 0", "prompt 1", "prompt 2", "prompt 5"]
    assert corpus[0] == "prompt 0 cont 0" and len(corpus) == 7


def test_tldr_hub_schema_gives_queries_ending_with_tldr_and_references(tmp_path):
    path = tmp_path / "tldr.parquet"
    pq.write_table(pa.table({"prompt": [f"SUBREDDIT: r/x\nPOST: story {i}\nTL;DR: " for i in range(5)],
                             "label": [f"summary {i}" for i in range(5)]}), path)
    corpus, rows = prepare(task="summarization", run_id="t", seed=0, world=world(path))
    assert all(r["text"].endswith("TL;DR:") and r["reference"].startswith("summary") for r in rows)
    assert [r["split"] for r in rows].count("eval") == 2 and all("\n" not in c for c in corpus)


# ---- bad inputs ----

def test_a_dataset_without_the_needed_column_names_the_file_and_the_columns(tmp_path):
    path = tmp_path / "reviews.csv"
    path.write_text("body,label\nhello,1\n")
    with pytest.raises(DataError, match=r"reviews.csv.*\['text', 'review'\].*\['body', 'label'\]"):
        get_task("sentiment").build(world(path), seed=0)
    rtp = tmp_path / "rtp.jsonl"
    rtp.write_text(json.dumps({"text": "x"}) + "\n")
    with pytest.raises(DataError, match=r"rtp.jsonl.*prompt.text"):
        get_task("toxicity").build(world(rtp), seed=0)
    with pytest.raises(DataError, match="not found"):
        get_task("summarization").build(world(tmp_path / "nope.csv"), seed=0)


def test_an_empty_split_after_filtering_says_why(tmp_path):
    short = tmp_path / "short.jsonl"
    short.write_text(json.dumps({"text": "Too short."}) + "\n")
    with pytest.raises(DataError, match=r"short.jsonl.*longer than 200"):
        get_task("sentiment").build(world(short), seed=0)
    mild = tmp_path / "mild.jsonl"
    mild.write_text("".join(json.dumps({"prompt": {"text": "hi", "toxicity": 0.1}}) + "\n" for _ in range(3)))
    with pytest.raises(DataError, match=r"mild.jsonl.*toxicity > 0.6"):
        get_task("toxicity").build(world(mild), seed=0)
    few = tmp_path / "few.jsonl"
    few.write_text("".join(json.dumps({"text": LONG}) + "\n" for _ in range(2)))
    with pytest.raises(DataError, match=r"few.jsonl.*2 usable prompts.*n_eval_prompts"):
        get_task("sentiment").build(world(few), seed=0)


# ---- HF classifier rewards (tiny model built from a config) ----

@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("clf")
    tok = train_tokenizer(["a good film", "a bad film"] * 20, vocab_size=300, out_dir=out)
    torch.manual_seed(0)
    config = DistilBertConfig(vocab_size=len(tok), dim=16, hidden_dim=32, n_layers=1, n_heads=2,
                              max_position_embeddings=64, pad_token_id=tok.pad_token_id,
                              id2label={0: "NEGATIVE", 1: "POSITIVE"}, label2id={"NEGATIVE": 0, "POSITIVE": 1})
    DistilBertForSequenceClassification(config).save_pretrained(out)
    return out


def test_hf_sentiment_reward_is_the_positive_logit(classifier_dir):
    reward = get_task("sentiment").make_reward(ScoreParams(scorer="hf_classifier", model=str(classifier_dir),
                                                           batch_size=2, scale=2.0))  # not read by the reward
    texts = ["a good film", "a bad film", "film"]
    tok = AutoTokenizer.from_pretrained(classifier_dir)
    model = DistilBertForSequenceClassification.from_pretrained(classifier_dir).eval()
    with torch.no_grad():
        direct = [model(**tok([t], return_tensors="pt")).logits[0, 1].item() for t in texts]
    assert reward.score(texts, references=None) == pytest.approx(direct, abs=1e-5)


def test_hf_toxicity_reward_is_one_minus_the_label_probability(classifier_dir):
    reward = get_task("toxicity").make_reward(ScoreParams(scorer="hf_classifier", model=str(classifier_dir),
                                                          label="NEGATIVE"))
    toxicity = reward.toxicity(["a bad film"])
    assert 0 < toxicity[0] < 1
    assert reward.score(["a bad film"]) == pytest.approx([1 - toxicity[0]])


def test_a_classifier_without_the_label_names_the_model_its_labels_and_the_fix(classifier_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"has labels \['NEGATIVE', 'POSITIVE'\] and no 'hate'.*score.label"):
        get_task("toxicity").make_reward(ScoreParams(scorer="hf_classifier", model=str(classifier_dir)))
    with pytest.raises(ConfigError, match=r"score.model.*could not be loaded"):
        get_task("sentiment").make_reward(ScoreParams(scorer="hf_classifier", model=str(tmp_path / "none")))
    with pytest.raises(ConfigError, match="needs 'score.model'"):
        get_task("sentiment").make_reward(ScoreParams(scorer="hf_classifier"))


# ---- critic fields and scoring against references ----

def test_summarization_critic_sees_document_summary_and_score():
    template = load_template(ROOT / "prompts" / "summarization.md")
    rows = [{"rollout_id": "a", "query": "Doc text here. TL;DR:", "response": " Doc here.", "response_ids": [1],
             "env_reward": 0.4}, {"rollout_id": "b", "query": "x TL;DR:", "response": "y", "response_ids": [1],
                                  "env_reward": 0.9}]
    (messages,) = round_requests(rows, template=template, threshold=0.5, fields=get_task("summarization").critic_fields)
    user = messages[-1]["content"]
    assert "<document>\nDoc text here.\n</document>" in user and "<summary>\nDoc here.\n</summary>" in user
    assert "Score of the summary: 0.4" in user


def test_score_step_uses_each_prompts_reference():
    prompts = [{"prompt_id": "p1", "reference": "Anna sold two bikes."}, {"prompt_id": "p2", "reference": "x y"}]
    rollouts = [{"rollout_id": "r1", "prompt_id": "p1", "response": "Anna sold two bikes."},
                {"rollout_id": "r2", "prompt_id": "p2", "response": "x"}]
    rows = score(rollouts, prompts, task="summarization", run_id="t", round_=1, params=ScoreParams(scorer="rouge1"))
    assert [r["env_reward"] for r in rows] == pytest.approx([100.0, 100 * 2 / 3])
    with pytest.raises(DataError, match="p1"):
        score(rollouts, prompts[1:], task="summarization", run_id="t", round_=1, params=ScoreParams(scorer="rouge1"))


# ---- local-data profiles on /work/shared/data ----

@pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} is absent: the local-data files exist only on dev/CI machines")
@pytest.mark.parametrize("profile", ["local-sentiment", "local-toxicity", "local-summarization"])
def test_local_data_profiles_prepare_and_score(profile):
    params = load_params(ROOT / f"configs/{profile}.yaml")
    w = dataclasses.replace(params.world, source=str(ROOT / params.world.source))
    corpus, rows = prepare(task=params.run.task, run_id="t", seed=0, world=w)
    assert len(corpus) > 1000 and [r["split"] for r in rows].count("eval") == w.n_eval_prompts
    rollouts = [{"rollout_id": f"r{i}", "prompt_id": r["prompt_id"], "response": r["text"][-40:]}
                for i, r in enumerate(rows[:50])]
    values = [s["env_reward"] for s in score(rollouts, rows, task=params.run.task, run_id="t", round_=1,
                                             params=params.score)]
    assert len(set(values)) > 1, values
