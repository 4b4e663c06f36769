"""train_round with ppo.algorithm grpo / rloo / reinforce_pp on a real tiny GPT-2 with no value head."""
import copy

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from pipeline.core.config import PPOParams
from pipeline.core.errors import PPOInputError
from pipeline.model.logprobs import response_logprobs
from pipeline.model.policy import PolicyWithValueHead, frozen_copy, load_policy, write_policy_files
from pipeline.model.sampling import sample_responses
from pipeline.train.group import (
    aggregate_loss,
    clipped_token_loss,
    dense_advantages,
    group_advantages,
    token_advantages,
)
from pipeline.train.ppo import FixedKLController, RunningMoments
from pipeline.train.trainer import RolloutBatch, make_optimizer, train_round

torch.set_num_threads(1)
EOS, PAD, G = 1, 0, 4
GOOD = range(2, 18)
QUERIES = [[2 + (i // G) % 5, 3] for i in range(32)]  # 8 groups of 4 rows with one query each
ALGORITHMS = [("grpo", "grpo"), ("grpo", "dr_grpo"), ("grpo", "dapo"), ("rloo", "grpo"), ("reinforce_pp", "grpo")]


def tiny_policy(seed=0):
    torch.manual_seed(seed)
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=64,
                        bos_token_id=EOS, eos_token_id=EOS, pad_token_id=PAD)
    return PolicyWithValueHead(GPT2LMHeadModel(config), None).eval()


def params(algorithm, loss_type="grpo", **overrides):
    return PPOParams(**{"learning_rate": 3e-3, "mini_batch_size": 8, "init_kl_coef": 0.05, "algorithm": algorithm,
                        "loss_type": loss_type, "adap_kl_ctrl": False, **overrides})


def rollout(policy, seed):
    out = sample_responses(policy, queries=QUERIES, eos_id=EOS, pad_id=PAD, max_new_tokens=8, seed=seed,
                           batch_size=32, progress=False)
    responses = [o["response_ids"] for o in out]
    return RolloutBatch(  # the critic "flags" token 20 with −0.5
        query_ids=QUERIES, response_ids=responses, behaviour_logprobs=[o["behaviour_logprobs"] for o in out],
        env_rewards=[sum(t in GOOD for t in r) / len(r) for r in responses],
        intrinsic_rewards=[[-0.5 if t == 20 else 0.0 for t in r] for r in responses],
    )


def run(policy, batch, p, seed=0, group_size=G):
    ref = frozen_copy(policy)
    optimizer = make_optimizer(policy, p.learning_rate)
    return train_round(policy=policy, ref_model=ref, optimizer=optimizer, batch=batch, params=p,
                       kl_controller=FixedKLController(p.init_kl_coef), score_moments=RunningMoments(), seed=seed,
                       progress=False, group_size=group_size, max_completion_length=8)


@pytest.mark.parametrize(("algorithm", "loss_type"), ALGORITHMS)
def test_a_round_trains_without_a_value_head(algorithm, loss_type):
    policy = tiny_policy()
    before = copy.deepcopy(policy.state_dict())
    steps = run(policy, rollout(policy, 0), params(algorithm, loss_type))
    assert len(steps) == 4 * 32 // 8
    assert all(s["value_loss"] == 0 and s["vf_clipfrac"] == 0 and s["skipped"] == 0 for s in steps)
    assert all(torch.isfinite(torch.tensor([s["policy_loss"], s["grad_norm"], s["approx_kl"]])).all() for s in steps)
    assert steps[0]["grad_norm"] > 0 and abs(steps[0]["ratio_mean"] - 1) < 1e-5
    assert any(not torch.equal(before[k], v) for k, v in policy.state_dict().items())
    assert not any("v_head" in name for name, _ in policy.named_parameters())


@pytest.mark.parametrize(("algorithm", "loss_type"), ALGORITHMS[:4])  # reinforce_pp: a token mean per minibatch, as PPO
def test_gradient_accumulation_gives_the_one_minibatch_step(algorithm, loss_type):
    # one epoch, one optimizer step over 32 rows: 1 minibatch of 32, or 2 of 16 accumulated; the normalisers
    # (response means, a constant, the step's token count) make both the same update
    base = tiny_policy()
    batch = rollout(base, 1)
    weights = []
    for mini, accumulation in ((32, 1), (16, 2)):
        policy = copy.deepcopy(base)
        run(policy, batch, params(algorithm, loss_type, ppo_epochs=1, mini_batch_size=mini,
                                  gradient_accumulation_steps=accumulation))
        weights.append(torch.cat([p.detach().flatten() for p in policy.parameters()]))
    # Adam's first step is lr * g / (|g| + eps): where |g| is near eps, float32 summation-order noise in g
    # moves a weight by up to ~lr * 1e-3 (1.6e-6 seen on a Xeon, < 1e-6 on an EPYC); a wrong normaliser
    # that is not a constant factor moves weights by a sizeable share of lr
    assert (weights[0] - weights[1]).abs().max() < 1e-3 * 3e-3


def test_the_first_grpo_loss_is_the_pure_functions_on_a_fresh_pass():
    policy = tiny_policy()
    batch = rollout(policy, 2)
    p = params("grpo", ppo_epochs=1, mini_batch_size=32, dense_weight=0.5)
    first = run(copy.deepcopy(policy), batch, p)[0]["policy_loss"]
    with torch.no_grad():
        fresh = response_logprobs(policy, query_ids=batch.query_ids, response_ids=batch.response_ids, pad_id=PAD,
                                  width=8)
    old = torch.tensor([r + [0.0] * (8 - len(r)) for r in batch.behaviour_logprobs])
    intrinsic = torch.tensor([r + [0.0] * (8 - len(r)) for r in batch.intrinsic_rewards])
    advantages = token_advantages(group_advantages(torch.tensor(batch.env_rewards), G),
                                  dense_advantages(intrinsic, fresh.mask, 0.5), fresh.mask)
    per_token = clipped_token_loss(logprobs=fresh.logprobs, old_logprobs=old, advantages=advantages,
                                   epsilon_low=0.2, epsilon_high=0.2, ref_logprobs=fresh.logprobs, beta=0.05)
    expected = aggregate_loss(per_token, fresh.mask, loss_type="grpo", rows=32, tokens=0, max_completion_length=8)
    assert abs(first - expected.item()) < 1e-5


def test_dense_weight_zero_ignores_the_critic_and_nonzero_uses_it():
    base = tiny_policy()
    batch = rollout(base, 3)
    silent = RolloutBatch(batch.query_ids, batch.response_ids, batch.behaviour_logprobs, batch.env_rewards,
                          [[0.0] * len(r) for r in batch.response_ids])
    assert any(v != 0 for row in batch.intrinsic_rewards for v in row)
    losses = {}
    for name, b, weight in (("w0", batch, 0.0), ("silent", silent, 0.0), ("w1", batch, 1.0)):
        losses[name] = run(copy.deepcopy(base), b, params("grpo", dense_weight=weight))[0]["policy_loss"]
    assert losses["w0"] == losses["silent"] and losses["w1"] != losses["w0"]


def test_group_algorithms_refuse_a_batch_without_groups():
    policy = tiny_policy()
    batch = rollout(policy, 0)
    with pytest.raises(PPOInputError, match="ppo.algorithm = grpo needs whole groups of at least 2 .* groups of 1"):
        run(policy, batch, params("grpo"), group_size=1)
    with pytest.raises(PPOInputError, match="groups of 3"):
        run(policy, batch, params("rloo"), group_size=3)
    assert run(policy, batch, params("reinforce_pp", ppo_epochs=1), group_size=1)  # needs no group


def test_a_value_free_policy_saves_and_loads_no_value_head(tmp_path):
    from conftest import save_tiny_gpt2, train_bpe

    tokenizer = train_bpe(["a good film", "a bad film"] * 10, vocab_size=300)
    tokenizer.pad_token = tokenizer.eos_token
    folder = save_tiny_gpt2(tmp_path / "base", tokenizer)
    policy, tokenizer = load_policy(folder, value_head=False)
    assert policy.v_head is None
    write_policy_files(policy, tokenizer, tmp_path / "saved")
    assert not (tmp_path / "saved" / "value_head.safetensors").exists()
    with_head, _ = load_policy(folder)
    assert sum(p.numel() for p in with_head.parameters()) - sum(p.numel() for p in policy.parameters()) == \
        with_head.v_head.weight.numel() + 1
