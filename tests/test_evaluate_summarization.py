"""Summarization evaluation with a reward model: rm_score, win_rate (ties half), per-sample rm_score rows."""
import dataclasses
import math

import pytest
import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model

from pipeline.core.config import EvaluateParams, ScoreParams
from pipeline.core.errors import ConfigError
from pipeline.core.store import SCHEMAS
from pipeline.evaluate.metrics import pairwise_win_rate, win_rate
from pipeline.model.pretrain import train_tokenizer
from pipeline.rewards.reward_model import TRUNK_HEAD_TEXT_PREFIX
from pipeline.steps.evaluate import evaluate
from pipeline.tasks import get_task

DOCS = ["On Monday, Anna bought two bikes in Oslo. It was cold. TL;DR:",
        "On Friday, Ben sold six chairs in Rome. A witness saw it. TL;DR:"]
REFS = ["Anna bought two bikes in Oslo.", "Ben sold six chairs in Rome."]
WORLD_ROWS = [{"prompt_id": f"e{i}", "split": "eval", "text": d, "reference": r}
              for i, (d, r) in enumerate(zip(DOCS, REFS))]


def test_win_rate_counts_ties_half():
    # 1 < 2 loses, 2 = 2 ties, 3 > 2 wins, 2 = 2 ties: (0 + 0.5 + 1 + 0.5) / 4
    assert win_rate([1.0, 2.0, 3.0, 2.0], [2.0, 2.0, 2.0, 2.0]) == 0.5
    assert win_rate([0.3], [0.1]) == 1.0 and math.isnan(win_rate([], []))
    assert win_rate([1.0 + 1e-9, 1.0 + 1e-5], [1.0, 1.0]) == 0.75  # within 1e-6: a tie (fp32 batching noise)


def test_pairwise_win_rate_meets_every_sample_of_the_same_prompt():
    # prompt 1: 1 vs 2 loses, 3 vs 2 wins -> 1/2; prompt 2: 5 vs 5 ties, 5 vs 4 wins -> 3/4; prompt 3 has no sample
    assert pairwise_win_rate([[1, 3], [5], []], [[2], [5, 4], [1]]) == pytest.approx((0.5 + 0.75) / 2)
    assert math.isnan(pairwise_win_rate([[]], [[1.0]]))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A tiny LM (the policy and base) and a trunk + head reward model sharing its tokenizer."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("models")
    tok = train_tokenizer(DOCS * 10 + REFS * 10, vocab_size=300, out_dir=root / "lm")
    torch.manual_seed(0)
    lm_config = GPT2Config(vocab_size=len(tok), n_positions=64, n_layer=1, n_head=2, n_embd=32,
                           bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    GPT2LMHeadModel(lm_config).save_pretrained(root / "lm")
    config = GPT2Config(vocab_size=len(tok), n_positions=128, n_embd=32, n_layer=1, n_head=2,
                        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    trunk, head = GPT2Model(config).eval(), nn.Linear(32, 1, bias=False)
    nn.init.normal_(head.weight, std=1.0)
    config.save_pretrained(root / "rm")
    tok.save_pretrained(root / "rm")
    state = {**{f"transformer.{k}": v for k, v in trunk.state_dict().items()}, "v_head.weight": head.weight.detach()}
    torch.save(state, root / "rm" / "pytorch_model.bin")
    return {"lm": str(root / "lm"), "rm": str(root / "rm"), "tok": tok, "trunk": trunk, "head": head}


def _direct(folders, document: str, summary: str) -> float:
    """The RM score computed here: one sequence, no padding, head on the last token's hidden state."""
    ids = torch.tensor([folders["tok"](f"{TRUNK_HEAD_TEXT_PREFIX}{document} {summary.strip()}")["input_ids"]])
    with torch.no_grad():
        return folders["head"](folders["trunk"](input_ids=ids).last_hidden_state[0, -1]).item()


def test_evaluator_reports_rm_score_and_win_rate_against_the_references(folders):
    evaluator = get_task("summarization").make_evaluator(
        dataclasses.replace(EvaluateParams(), reward_model=folders["rm"]), None, seed=0)
    samples = [["Anna bought bikes.", "It was cold."], ["Ben sold six chairs in Rome."]]
    metrics, per_sample = evaluator.metrics(samples, WORLD_ROWS)
    sample_scores = [_direct(folders, DOCS[0], s) for s in samples[0]] + [_direct(folders, DOCS[1], samples[1][0])]
    reference_scores = [_direct(folders, d, r) for d, r in zip(DOCS, REFS)]
    assert per_sample["rm_score"] == pytest.approx(sample_scores, abs=1e-5)
    assert metrics["rm_score"] == pytest.approx(sum(sample_scores) / 3, abs=1e-5)
    assert metrics["rm_reference_score"] == pytest.approx(sum(reference_scores) / 2, abs=1e-5)
    opponents = [reference_scores[0], reference_scores[0], reference_scores[1]]
    wins = [1.0 if s > o + 1e-6 else 0.0 if s < o - 1e-6 else 0.5 for s, o in zip(sample_scores, opponents)]
    assert wins[2] == 0.5  # the third sample is its reference: a tie
    assert metrics["win_rate"] == pytest.approx(sum(wins) / 3)
    assert metrics["rouge1"] == pytest.approx(100 * (2 / 3 + 0 + 1) / 3)  # P 3/3, R 3/6; no overlap; equal


def test_without_a_reward_model_there_are_no_rm_metrics(folders):
    metrics, per_sample = get_task("summarization").make_evaluator(EvaluateParams(), None, seed=0).metrics(
        [["a"], ["b"]], WORLD_ROWS)
    assert set(metrics) == {"rouge1", "rouge2", "rougeL"} and per_sample == {"rm_score": [None, None]}


def test_evaluate_step_writes_rm_scores_per_sample_and_reuses_the_training_rm(folders):
    params = dataclasses.replace(EvaluateParams(), reward_model=folders["rm"], n_prompts=2, samples_per_prompt=3,
                                 max_new_tokens=6, batch_size=4)
    score = ScoreParams(scorer="reward_model", model=folders["rm"])
    rows, samples, metrics = evaluate(WORLD_ROWS, base_dir=folders["lm"], policy_dir=folders["lm"],
                                      policy_name="round=0001", run_id="t", round_=1, seed=0, params=params,
                                      task="summarization", score=score)
    world = metrics["round=0001"]["world"]
    assert {"rouge1", "rm_score", "rm_reference_score", "win_rate", "env_reward_mean"} <= set(world)
    assert all(set(s) == set(SCHEMAS["eval_samples"].names) for s in samples)
    mine = [s for s in samples if s["policy"] == "round=0001"]
    assert world["rm_score"] == pytest.approx(sum(s["rm_score"] for s in mine) / 6, abs=1e-6)
    # the training reward is the same RM: env_reward is the RM score of the same sample
    assert [s["env_reward"] for s in mine] == pytest.approx([s["rm_score"] for s in mine], abs=1e-6)
    doc = {f"world/e{i}": d for i, d in enumerate(DOCS)}
    assert mine[0]["rm_score"] == pytest.approx(_direct(folders, doc[mine[0]["prompt_id"]], mine[0]["response"]),
                                                abs=1e-5)
    assert 0.0 <= world["win_rate"] <= 1.0 and world["win_rate"] * 6 * 2 == pytest.approx(round(world["win_rate"] * 12))
    assert {"world/win_rate", "world/rm_score"} <= {r["metric"] for r in rows}


def test_the_training_reward_model_is_reused_and_a_bad_folder_is_a_config_error(folders, tmp_path):
    task = get_task("summarization")
    reward = task.make_reward(ScoreParams(scorer="reward_model", model=folders["rm"]))
    params = dataclasses.replace(EvaluateParams(), reward_model=folders["rm"])
    assert task.make_evaluator(params, reward, seed=0).reward_model is reward.model
    with pytest.raises(ConfigError, match="no config.json"):
        task.make_evaluator(dataclasses.replace(params, reward_model=str(tmp_path)), reward, seed=0)
