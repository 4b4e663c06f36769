"""Golden tests of pipeline/train/group.py against TRL 1.16's own GRPOTrainer / RLOOTrainer code.

Losses and gradients: TRL's `_compute_loss` is called on a bare trainer object (built with __new__, only the
attributes that method reads set) whose log-prob pass returns our tensor, so the loss is TRL's code, not a copy.
Advantages live inside TRL's 900-line `_generate_and_score_completions`, which needs models and generation; the
reference functions below follow its lines (named in each) using TRL's own `nanstd`.
"""
from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from trl import GRPOTrainer, RLOOTrainer
from trl.trainer.utils import nanstd

from pipeline.train.group import (
    aggregate_loss,
    clipped_token_loss,
    dense_advantages,
    group_advantages,
    k3_kl,
    reinforce_pp_advantages,
    return_to_go,
    rloo_advantages,
    sequence_clipped_loss,
    sequence_kl_rewards,
    token_advantages,
)
from pipeline.train.ppo import total_rewards

TOL = 1e-6
B, T, V, G = 6, 5, 7, 3


class _Accelerator:
    """One process: TRL's gathers and reductions return their input."""

    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    def reduce(self, x, reduction="sum"):
        return x


def _batch(seed: int = 0):
    """Logits (leaf with grad) -> per-token log-probs, plus old/ref log-probs, a ragged mask and rewards."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=gen, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(0, V, (B, T), generator=gen)
    mask = torch.ones(B, T, dtype=torch.float64)
    for row, length in enumerate([5, 3, 4, 1, 5, 2]):
        mask[row, length:] = 0
    old = torch.log_softmax(logits.detach() + 0.3 * torch.randn(B, T, V, generator=gen, dtype=torch.float64), -1)
    ref = torch.log_softmax(logits.detach() + 0.5 * torch.randn(B, T, V, generator=gen, dtype=torch.float64), -1)
    pick = tokens.unsqueeze(-1)
    rewards = torch.randn(B, generator=gen, dtype=torch.float64)
    return logits, pick, mask, old.gather(-1, pick).squeeze(-1), ref.gather(-1, pick).squeeze(-1), rewards


def _logprobs(logits, pick):
    return torch.log_softmax(logits, -1).gather(-1, pick).squeeze(-1)  # (B, T)


def _trl_grpo_advantages(rewards, num_generations, scale_rewards):
    """grpo_trainer.py lines 2765-2787 and 2810 (sum_then_normalize, one reward function, no NaN)."""
    mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)
    mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
    if scale_rewards in ["group", "none"]:
        std_rewards = nanstd(rewards.view(-1, num_generations), dim=1)
        std_rewards = std_rewards.repeat_interleave(num_generations, dim=0)
    else:  # "batch"
        std_rewards = nanstd(rewards).expand_as(rewards)
    advantages = rewards - mean_grouped_rewards
    if scale_rewards != "none":
        advantages = advantages / (std_rewards + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


def _trl_rloo_advantages(rewards, num_generations, normalize_advantages, beta=0.0, per_token_kl=None, mask=None):
    """rloo_trainer.py lines 1664-1699 (no reward clipping, no NaN)."""
    if beta != 0.0:
        kl = (per_token_kl * mask).sum(-1)
        rewards = rewards - beta * kl
    grouped_rewards = rewards.view(-1, num_generations)
    scorable_counts = (~torch.isnan(grouped_rewards)).sum(dim=1, keepdim=True)
    grouped_sum = torch.nansum(grouped_rewards, dim=1, keepdim=True)
    baselines = (grouped_sum - grouped_rewards) / (scorable_counts - 1)
    advantages = rewards - baselines.view(-1)
    if normalize_advantages:
        advantages = (advantages - torch.nanmean(advantages)) / (nanstd(advantages) + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


def _bare(cls, **attributes):
    trainer = cls.__new__(cls)
    common = {"model": SimpleNamespace(training=True), "accelerator": _Accelerator(), "aux_loss_enabled": False,
              "_metrics": {"train": defaultdict(list), "eval": defaultdict(list)}, "use_vllm": False}
    for key, value in {**common, **attributes}.items():
        setattr(trainer, key, value)
    return trainer


def _trl_grpo_loss(loss_type, logprobs, mask, old, ref, advantages, beta, eps_low, eps_high, max_len):
    trainer = _bare(GRPOTrainer, top_entropy_quantile=1.0, off_policy_mask_threshold=None, loss_type=loss_type,
                    importance_sampling_level="token", beta=beta, epsilon_low=eps_low, epsilon_high=eps_high,
                    args=SimpleNamespace(delta=None, use_bias_correction_kl=True, steps_per_generation=1),
                    current_gradient_accumulation_steps=1, max_completion_length=max_len,
                    _entropy_bonus_enabled=False)
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (logprobs, torch.zeros_like(logprobs), None)
    inputs = {"prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
              "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": mask,
              "advantages": advantages, "old_per_token_logps": old, "ref_per_token_logps": ref,
              "num_items_in_batch": mask.sum()}
    return trainer._compute_loss(None, inputs)


def _trl_grpo_per_token_loss(logprobs, old, ref, advantages, beta, eps_low, eps_high):
    """grpo_trainer.py lines 3082-3119 and 3149-3150 (token level, no delta, no masks, no vLLM)."""
    advantages = advantages.unsqueeze(1)
    coef_1 = torch.exp(logprobs - old)
    per_token_kl = torch.exp(ref - logprobs) - (ref - logprobs) - 1
    per_token_kl = per_token_kl * coef_1
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    if beta != 0.0:
        per_token_loss = per_token_loss + beta * per_token_kl
    return per_token_loss


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages_equal_trl(scale):
    rewards = _batch()[-1]
    rewards[3:] = 0.7  # a tied group: zero std, so the 1e-4 guard matters
    ours = group_advantages(rewards, G, scale)
    assert torch.allclose(ours, _trl_grpo_advantages(rewards, G, scale), atol=TOL, rtol=0)
    assert ours[3:].abs().max() < 1e-9  # the mean of three 0.7s is 0.7 up to rounding


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_grpo_loss_and_gradients_equal_trl(loss_type, beta):
    logits, pick, mask, old, ref, rewards = _batch(1)
    advantages = group_advantages(rewards, G, "none" if loss_type == "dr_grpo" else "group")
    eps_low, eps_high, max_len = 0.2, 0.28, 8
    theirs_logits = logits.detach().clone().requires_grad_(True)
    theirs = _trl_grpo_loss(loss_type, _logprobs(theirs_logits, pick), mask, old, ref, advantages, beta,
                            eps_low, eps_high, max_len)
    theirs.backward()
    lp = _logprobs(logits, pick)
    per_token = clipped_token_loss(logprobs=lp, old_logprobs=old, advantages=token_advantages(
        advantages, dense_advantages(torch.zeros_like(mask), mask, 0.0), mask), epsilon_low=eps_low,
        epsilon_high=eps_high, ref_logprobs=ref, beta=beta)
    reference = _trl_grpo_per_token_loss(lp.detach(), old, ref, advantages, beta, eps_low, eps_high)
    assert torch.allclose(per_token * mask, reference * mask, atol=TOL, rtol=0)
    ours = aggregate_loss(per_token, mask, loss_type=loss_type, rows=B, tokens=mask.sum().item(),
                          max_completion_length=max_len)
    ours.backward()
    assert abs(ours.item() - theirs.item()) < TOL
    assert torch.allclose(logits.grad, theirs_logits.grad, atol=TOL, rtol=0)
    assert logits.grad.abs().sum() > 0


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("beta", [0.0, 0.05])
def test_rloo_advantages_loss_and_gradients_equal_trl(normalize, beta):
    logits, pick, mask, old, ref, rewards = _batch(2)
    rewards = sequence_kl_rewards(rewards, old - ref, mask, beta)
    advantages = rloo_advantages(rewards, G, normalize)
    expected = _trl_rloo_advantages(_batch(2)[-1], G, normalize, beta, old - ref, mask)
    assert torch.allclose(advantages, expected, atol=TOL, rtol=0)
    trainer = _bare(RLOOTrainer, epsilon_low=0.2, epsilon_high=0.2)
    theirs_logits = logits.detach().clone().requires_grad_(True)
    theirs_lp = _logprobs(theirs_logits, pick)
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (theirs_lp, torch.zeros_like(theirs_lp), None)
    inputs = {"prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
              "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": mask,
              "old_logps": (old * mask).sum(1), "advantages": advantages}
    theirs = trainer._compute_loss(None, inputs)
    theirs.backward()
    ours = sequence_clipped_loss(logprobs=_logprobs(logits, pick), old_logprobs=old, advantages=advantages,
                                 mask=mask, epsilon_low=0.2, epsilon_high=0.2).mean()
    ours.backward()
    assert abs(ours.item() - theirs.item()) < TOL
    assert torch.allclose(logits.grad, theirs_logits.grad, atol=TOL, rtol=0)
    assert logits.grad.abs().sum() > 0


def test_groups_must_be_whole():
    with pytest.raises(ValueError, match="whole number of groups of 4"):
        group_advantages(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="group of one"):
        rloo_advantages(torch.zeros(3), 1)


def test_k3_is_zero_at_equality_and_positive_elsewhere():
    lp = torch.tensor([[-1.0, -2.0]])
    assert k3_kl(lp, lp).abs().max() == 0
    # exp(−1) − (−1) − 1 = e^−1 for ref − lp = −1
    assert math.isclose(k3_kl(lp, lp - 1.0)[0, 0].item(), math.exp(-1), abs_tol=1e-7)


def _reinforce_pp_by_loops(env, intrinsic, kl, mask, beta, gamma):
    """REINFORCE++ written out: rewards per token, return-to-go by a python loop, batch whitening (biased var)."""
    rows = []
    for i in range(len(env)):
        n = int(mask[i].sum())
        r = [intrinsic[i][t] - beta * kl[i][t] for t in range(n)]
        r[-1] += env[i]
        g, running = [0.0] * n, 0.0
        for t in reversed(range(n)):
            running = r[t] + gamma * running
            g[t] = running
        rows.append(g)
    flat = [x for row in rows for x in row]
    mean = sum(flat) / len(flat)
    var = sum((x - mean) ** 2 for x in flat) / len(flat)
    return [[(x - mean) / math.sqrt(max(var, 1e-8)) for x in row] for row in rows]


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_pp_equals_loops(gamma):
    _, _, mask, old, ref, env = _batch(3)
    intrinsic = torch.zeros(B, T, dtype=torch.float64)
    intrinsic[0, 1], intrinsic[2, 0], intrinsic[4, 3] = -0.5, 0.5, -0.5
    kl, beta = (old - ref) * mask, 0.05
    rewards, _ = total_rewards(env_rewards=env, kl=kl, intrinsic_rewards=intrinsic, mask=mask, kl_coef=beta)
    ours = reinforce_pp_advantages(rewards, mask, gamma)
    expected = _reinforce_pp_by_loops(env.tolist(), intrinsic.tolist(), kl.tolist(), mask, beta, gamma)
    for i, row in enumerate(expected):
        assert torch.allclose(ours[i, : len(row)], torch.tensor(row, dtype=torch.float64), atol=1e-9, rtol=0)
        assert ours[i, len(row):].abs().sum() == 0


def test_dense_term_by_hand_two_groups_three_tokens():
    # two groups of two responses, three token positions; row 2 has two tokens
    intrinsic = torch.tensor([[0.0, -0.5, 0.0], [0.0, 0.0, 0.0], [0.5, 0.0, 9.0], [0.0, 0.0, -0.5]])
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 1], [1, 1, 0], [1, 1, 1]])
    # return-to-go: [-.5, -.5, 0], [0, 0, 0], [.5, 0, (masked: the 9 is padding)], [-.5, -.5, -.5]
    assert return_to_go(intrinsic, mask).tolist() == [[-0.5, -0.5, 0.0], [0.0, 0.0, 0.0], [0.5, 0.0, 0.0],
                                                      [-0.5, -0.5, -0.5]]
    # 11 masked tokens, six of them ±0.5: rms = sqrt(6 · 0.25 / 11) = sqrt(3/22) = 0.3692745
    unit = 0.5 / (math.sqrt(3 / 22) + 1e-4)  # = 1.353640
    assert math.isclose(unit, 1.353640, rel_tol=1e-6)
    dense = dense_advantages(intrinsic, mask, weight=0.5)
    expected = 0.5 * torch.tensor([[-unit, -unit, 0], [0, 0, 0], [unit, 0, 0], [-unit, -unit, -unit]])
    assert torch.allclose(dense, expected, atol=1e-6, rtol=0)
    assert dense_advantages(intrinsic, mask, weight=0.0).abs().sum() == 0
    # group 1's env rewards differ (A = ±0.5 / (0.70711 + 1e-4) = ±0.707007); group 2 is tied (A = 0), so its
    # only signal is the critic's
    outcome = group_advantages(torch.tensor([1.0, 0.0, 0.5, 0.5]), 2)
    assert torch.allclose(outcome, torch.tensor([0.70701, -0.70701, 0.0, 0.0]), atol=1e-5)
    total = token_advantages(outcome, dense, mask)
    assert torch.allclose(total[0], torch.tensor([0.70701 - 0.676820, 0.70701 - 0.676820, 0.70701]), atol=1e-5)
    assert torch.allclose(total[3], torch.tensor([-0.676820] * 3), atol=1e-5)
    assert total[2, 2] == 0
