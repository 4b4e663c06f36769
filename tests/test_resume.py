"""Resume: round 2 trained from round 1's checkpoint on disk equals rounds 1 and 2 run in one go.

The resumed path is the `ppo` stage's own code (pipeline.steps.ppo_round.ppo_round: load policy
and trainer state, train, save). The uninterrupted path keeps the same objects in memory across
both rounds and calls train_round directly with the same per-round seeds. Equality is exact.
"""
from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

from pipeline.core.config import PPOParams
from pipeline.core.errors import ConfigError
from pipeline.core.seeding import round_seed
from pipeline.model.policy import load_policy, load_reference
from pipeline.model.sampling import sample_responses
from pipeline.steps.ppo_round import new_kl_controller, ppo_round, step_row
from pipeline.train.ppo import RunningMoments
from pipeline.train.trainer import RolloutBatch, make_optimizer, train_round

torch.set_num_threads(1)
PAD, EOS, VOCAB, SEED = 0, 1, 64, 11
QUERIES = [[EOS, 2 + i % 7, 3 + i % 3] for i in range(16)]
# score scaling + adaptive KL with a short horizon: the moments and β change visibly every round,
# so a checkpoint that lost them would give a different round 2
PARAMS = PPOParams(learning_rate=3e-3, mini_batch_size=4, gradient_accumulation_steps=2, ppo_epochs=2,
                   init_kl_coef=0.05, horizon=50.0, target=0.01, use_score_scaling=True, use_score_norm=True)


def save_tiny_base(path, n_layer: int = 1) -> None:
    """A tiny GPT-2 with a word-level tokenizer saved like the base stage saves it (no value head)."""
    torch.manual_seed(0)
    config = GPT2Config(n_layer=n_layer, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=64,
                        bos_token_id=EOS, eos_token_id=EOS, pad_token_id=PAD)
    vocab = {"<pad>": PAD, "<eos>": EOS, **{f"w{i}": i for i in range(2, VOCAB)}}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>")
    GPT2LMHeadModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("resume") / "base"
    save_tiny_base(path)
    return path


def round_tables(policy, round_: int) -> tuple[list[dict], list[dict], list[dict]]:
    """Rollouts sampled from `policy` for `round_` and their score and annotation rows."""
    samples = sample_responses(policy, queries=QUERIES, eos_id=EOS, pad_id=PAD, max_new_tokens=6,
                               seed=round_seed(SEED, round_, 2), batch_size=16, progress=False)
    rollouts, scores, annotations = [], [], []
    for i, (query, sample) in enumerate(zip(QUERIES, samples)):
        ids, rollout_id = sample["response_ids"], f"r{round_:04d}-{i:05d}"
        rollouts.append({"rollout_id": rollout_id, "query_ids": query, "response_ids": ids,
                         "behaviour_logprobs": sample["behaviour_logprobs"]})
        reward = sum(t < 20 for t in ids) / len(ids)
        scores.append({"rollout_id": rollout_id, "env_reward": reward, "env_reward_shaped": reward})
        annotations.append({"rollout_id": rollout_id, "token_rewards": [0.3 if t % 2 else 0.0 for t in ids]})
    return rollouts, scores, annotations


def as_batch(rollouts, scores, annotations) -> RolloutBatch:
    return RolloutBatch(query_ids=[r["query_ids"] for r in rollouts], response_ids=[r["response_ids"] for r in rollouts],
                        behaviour_logprobs=[r["behaviour_logprobs"] for r in rollouts],
                        env_rewards=[s["env_reward"] for s in scores],
                        intrinsic_rewards=[a["token_rewards"] for a in annotations])


def without_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "tokens_per_s"} for row in rows]


@pytest.fixture(scope="module")
def uninterrupted(base_dir):
    """Rounds 1 and 2 with one set of in-memory objects: tables, rows, weights and state per round."""
    policy, _ = load_policy(base_dir, seed=SEED)
    reference = load_reference(base_dir)
    optimizer, controller, moments = make_optimizer(policy, PARAMS.learning_rate), new_kl_controller(PARAMS), RunningMoments()
    rounds = {}
    for round_ in (1, 2):
        torch.manual_seed(round_seed(SEED, round_, 3))  # as ppo_round; the stage process starts here
        tables = round_tables(policy, round_)
        stats = train_round(policy=policy, ref_model=reference, optimizer=optimizer, batch=as_batch(*tables),
                            params=PARAMS, kl_controller=controller, score_moments=moments,
                            seed=round_seed(SEED, round_, 4), progress=False)
        rounds[round_] = {
            "tables": tables,
            "rows": [step_row(s, run_id="t", round_=round_, step=i) for i, s in enumerate(stats)],
            "weights": {k: v.clone() for k, v in policy.state_dict().items()},
            "optimizer": {k: {n: t.clone() for n, t in v.items()} for k, v in optimizer.state_dict()["state"].items()},
            "controller": controller.state_dict(), "moments": moments.state_dict(),
        }
    return rounds


def run_stage_round(base_dir, policy_dir, out_dir, round_: int, tables) -> list[dict]:
    return ppo_round(*tables, policy_dir=str(policy_dir), reference_dir=str(base_dir), out_dir=str(out_dir),
                     params=PARAMS, run_id="t", round_=round_, seed=SEED)


def saved_weights(directory) -> dict:
    policy, _ = load_policy(directory, seed=12345)  # a wrong seed: the value head must come from the file
    return policy.state_dict()


def test_resumed_round_2_equals_uninterrupted_run(base_dir, uninterrupted, tmp_path):
    rows1 = run_stage_round(base_dir, base_dir, tmp_path / "round=0001", 1, uninterrupted[1]["tables"])
    rows2 = run_stage_round(base_dir, tmp_path / "round=0001", tmp_path / "round=0002", 2, uninterrupted[2]["tables"])

    assert without_timing(rows1) == without_timing(uninterrupted[1]["rows"])
    assert without_timing(rows2) == without_timing(uninterrupted[2]["rows"])
    for round_, rows in ((1, rows1), (2, rows2)):
        expected, weights = uninterrupted[round_], saved_weights(tmp_path / f"round={round_:04d}")
        assert weights.keys() == expected["weights"].keys()
        assert all(torch.equal(weights[k], expected["weights"][k]) for k in weights), f"round {round_} weights"
        optimizer = torch.load(tmp_path / f"round={round_:04d}" / "optimizer.pt", weights_only=True)["state"]
        assert optimizer.keys() == expected["optimizer"].keys()
        for key, state in optimizer.items():
            assert all(torch.equal(state[n], expected["optimizer"][key][n]) for n in ("step", "exp_avg", "exp_avg_sq"))
        trainer_state = json.loads((tmp_path / f"round={round_:04d}" / "trainer_state.json").read_text())
        assert trainer_state == {"kl_controller": expected["controller"], "score_moments": expected["moments"],
                                 "round": round_}
    assert int(optimizer[0]["step"]) == len(rows1) + len(rows2)  # Adam's step count carried over
    assert uninterrupted[2]["controller"]["value"] != uninterrupted[1]["controller"]["value"] != PARAMS.init_kl_coef


def test_round_2_without_trainer_state_differs(base_dir, uninterrupted, tmp_path):
    """The negative control: dropping optimizer.pt and trainer_state.json changes round 2."""
    run_stage_round(base_dir, base_dir, tmp_path / "round=0001", 1, uninterrupted[1]["tables"])
    weights_only = tmp_path / "weights-only"
    shutil.copytree(tmp_path / "round=0001", weights_only)
    (weights_only / "optimizer.pt").unlink()
    (weights_only / "trainer_state.json").unlink()
    rows = run_stage_round(base_dir, weights_only, tmp_path / "round=0002", 2, uninterrupted[2]["tables"])
    assert rows[0]["kl_coef"] == PARAMS.init_kl_coef != uninterrupted[2]["rows"][0]["kl_coef"]
    weights = saved_weights(tmp_path / "round=0002")
    assert any(not torch.equal(weights[k], uninterrupted[2]["weights"][k]) for k in weights)


def test_round_cursor_rejects_a_checkpoint_of_the_same_or_a_later_round(base_dir, uninterrupted, tmp_path):
    run_stage_round(base_dir, base_dir, tmp_path / "round=0002", 2, uninterrupted[2]["tables"])
    with pytest.raises(ConfigError, match="holds the checkpoint of round 2, but this is round 2"):
        run_stage_round(base_dir, tmp_path / "round=0002", tmp_path / "again", 2, uninterrupted[2]["tables"])
    assert not (tmp_path / "again").exists()


def test_round_2_trains_at_its_own_learning_rate_not_the_checkpoints(base_dir, uninterrupted, tmp_path):
    """optimizer.pt holds round 1's lr in its param_groups; round 2 must train at its own ppo.learning_rate.

    The update is checked against one computed here by hand: round 1's weights, Adam moments and
    step count set into a fresh Adam at the new lr, and the round's KL controller and score moments.
    """
    round_1 = tmp_path / "round=0001"
    run_stage_round(base_dir, base_dir, round_1, 1, uninterrupted[1]["tables"])
    assert torch.load(round_1 / "optimizer.pt", weights_only=True)["param_groups"][0]["lr"] == PARAMS.learning_rate
    lowered = dataclasses.replace(PARAMS, learning_rate=PARAMS.learning_rate / 7)
    rows = ppo_round(*uninterrupted[2]["tables"], policy_dir=str(round_1), reference_dir=str(base_dir),
                     out_dir=str(tmp_path / "round=0002"), params=lowered, run_id="t", round_=2, seed=SEED)

    assert [row["lr"] for row in rows] == [lowered.learning_rate] * len(rows)
    saved = torch.load(tmp_path / "round=0002" / "optimizer.pt", weights_only=True)
    assert [group["lr"] for group in saved["param_groups"]] == [lowered.learning_rate]
    assert [group["fused"] for group in saved["param_groups"]] == [True]
    # the same round by hand: Adam built at the new lr, its state (not its lr) taken from round 1
    torch.manual_seed(round_seed(SEED, 2, 3))
    policy, _ = load_policy(round_1, seed=SEED)
    optimizer = make_optimizer(policy, lowered.learning_rate)
    previous = torch.load(round_1 / "optimizer.pt", weights_only=True)["state"]
    for i, param in enumerate(optimizer.param_groups[0]["params"]):
        optimizer.state[param] = {key: value.clone() for key, value in previous[i].items()}
    trainer_state = json.loads((round_1 / "trainer_state.json").read_text())
    controller, moments = new_kl_controller(lowered), RunningMoments()
    controller.load_state_dict(trainer_state["kl_controller"])
    moments.load_state_dict(trainer_state["score_moments"])
    stats = train_round(policy=policy, ref_model=load_reference(base_dir), optimizer=optimizer,
                        batch=as_batch(*uninterrupted[2]["tables"]), params=lowered, kl_controller=controller,
                        score_moments=moments, seed=round_seed(SEED, 2, 4), progress=False)
    assert without_timing(rows) == without_timing([step_row(s, run_id="t", round_=2, step=i)
                                                   for i, s in enumerate(stats)])
    weights, expected = saved_weights(tmp_path / "round=0002"), policy.state_dict()
    assert all(torch.equal(weights[k], expected[k]) for k in weights)
    # and it is not the update at round 1's lr
    assert any(not torch.equal(weights[k], uninterrupted[2]["weights"][k]) for k in weights)
