"""The evaluate step on a real tiny GPT-2 and BPE tokenizer: decoding, rows, metrics, fluency LM."""
import dataclasses
import json
import math

import pytest
import torch
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

from pipeline.core.config import EvaluateParams
from pipeline.core.store import SCHEMAS
from pipeline.data.world import generate_reviews
from pipeline.evaluate.decode import sample_continuations
from pipeline.model.pretrain import train_tokenizer
from pipeline.steps.evaluate import evaluate

METRICS = {"positive_percent", "env_reward_mean", "perplexity", "dist_1", "dist_2", "dist_3", "kl_to_base", "n_samples"}
WORLD_ROWS = [{"prompt_id": f"e{i}", "split": "eval", "text": t}
              for i, t in enumerate(["The plot", "I thought the", "Overall, the"])]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    torch.set_num_threads(1)
    dirs = []
    for seed in (0, 1):
        out = tmp_path_factory.mktemp(f"lm{seed}")
        tok = train_tokenizer(generate_reviews(300, seed=0), vocab_size=300, out_dir=out)
        torch.manual_seed(seed)
        GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=64, n_layer=1, n_head=2, n_embd=32,
                                   bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)).save_pretrained(out)
        dirs.append(str(out))
    return dirs


def _params(**kw) -> EvaluateParams:
    return dataclasses.replace(EvaluateParams(), n_prompts=2, samples_per_prompt=3, max_new_tokens=6, batch_size=4, **kw)


def test_decoding_is_seeded_and_respects_max_new_tokens(model_dirs):
    tok = AutoTokenizer.from_pretrained(model_dirs[0])
    lm = GPT2LMHeadModel.from_pretrained(model_dirs[0])
    queries = [[tok.bos_token_id] + tok.encode(t) for t in ("The plot", "I thought the", "A")] * 2
    run = lambda seed: sample_continuations(lm, tok, queries, max_new_tokens=5, top_p=0.9, seed=seed, batch_size=4)
    first = run(0)
    assert first == run(0) and first != run(1)
    assert len(first) == 6 and all(len(c) <= 5 and tok.eos_token_id not in c for c in first)


def test_rows_and_metrics_for_two_policies_and_two_prompt_sets(model_dirs, tmp_path):
    dexperts = tmp_path / "negative_prompts.jsonl"
    dexperts.write_text("".join(json.dumps({"prompt": {"text": t}}) + "\n" for t in ("It was", "Nobody", "x")))
    params = _params(prompts=["world", str(dexperts)])
    run = lambda: evaluate(WORLD_ROWS, base_dir=model_dirs[0], policy_dir=model_dirs[1], policy_name="round=0002",
                           run_id="t", round_=2, seed=0, params=params)
    rows, samples, metrics = run()
    assert set(metrics) == {"base", "round=0002"}
    for by_set in metrics.values():
        assert set(by_set) == {"world", "negative_prompts"}
        for values in by_set.values():
            assert set(values) == METRICS and values["n_samples"] == 2 * 3
            assert 0 <= values["positive_percent"] <= 100 and math.isfinite(values["perplexity"])
    assert len(rows) == 2 * 2 * len(METRICS)
    assert metrics["base"]["world"]["kl_to_base"] == 0.0  # the base against itself
    assert metrics["round=0002"]["world"]["kl_to_base"] > 0  # another model's samples are likelier under it
    assert {r["metric"] for r in rows} >= {"world/positive_percent", "negative_prompts/dist_3"}
    assert len(samples) == 2 * 2 * 2 * 3
    assert all(set(s) == set(SCHEMAS["eval_samples"].names) for s in samples)
    assert [s["prompt_id"] for s in samples[:6]] == ["world/e0"] * 3 + ["world/e1"] * 3
    assert samples[6]["prompt_id"] == "negative_prompts/0" and samples[6]["query"] == "It was"
    assert (rows, samples, metrics) == run()  # seeded: identical on a re-run


def test_same_model_as_base_and_policy_gives_identical_metrics(model_dirs):
    _, _, metrics = evaluate(WORLD_ROWS, base_dir=model_dirs[0], policy_dir=model_dirs[0], policy_name="round=0001",
                             run_id="t", round_=1, seed=0, params=_params())
    assert metrics["base"] == metrics["round=0001"]


def test_another_fluency_model_changes_perplexity_only(model_dirs):
    kw = dict(base_dir=model_dirs[0], policy_dir=model_dirs[0], policy_name="round=0001", run_id="t", round_=1, seed=0)
    _, _, own = evaluate(WORLD_ROWS, params=_params(), **kw)
    _, _, other = evaluate(WORLD_ROWS, params=_params(fluency_model=model_dirs[1]), **kw)
    a, b = own["base"]["world"], other["base"]["world"]
    assert a["perplexity"] != b["perplexity"] and math.isfinite(b["perplexity"])
    assert {k: v for k, v in a.items() if k != "perplexity"} == {k: v for k, v in b.items() if k != "perplexity"}


def test_instruction_is_seen_by_the_sampler_only(model_dirs):
    """The prompting baseline: sampling from instruction + prompt equals sampling from that text as the
    prompt, while the rows keep the plain prompt and the perplexity is conditioned on it."""
    instruction = "Overall, the plot "
    plain = [{"prompt_id": "e0", "split": "eval", "text": "I thought the"}]
    joined = [{"prompt_id": "e0", "split": "eval", "text": instruction + "I thought the"}]
    run = lambda rows, **kw: evaluate(rows, base_dir=model_dirs[0], policy_dir=model_dirs[1], policy_name="round=0001",
                                      run_id="t", round_=1, seed=0, params=_params(**kw))[1]
    with_instruction, as_prompt, without = run(plain, instruction=instruction), run(joined), run(plain)
    assert [r["response"] for r in with_instruction] == [r["response"] for r in as_prompt]
    assert [r["response"] for r in with_instruction] != [r["response"] for r in without]
    assert {r["query"] for r in with_instruction} == {"I thought the"}
    assert [r["perplexity"] for r in with_instruction] != [r["perplexity"] for r in as_prompt]
