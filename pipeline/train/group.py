"""The value-free algorithms' math: group-relative advantages (GRPO, RLOO), REINFORCE++ and the critic's dense term.

Pure functions over tensors, beside pipeline/train/ppo.py (whose mask convention they share: `mask` is a float
(B, T) tensor, 1 = response token, 0 = padding). Shapes: B = responses, T = response positions, G = responses per
prompt (rollout.samples_per_prompt). A batch holds B / G whole groups, each group's G rows consecutive.
Sources, named per function: TRL 1.16 `GRPOTrainer` / `RLOOTrainer` (trl/trainer/grpo_trainer.py,
rloo_trainer.py) and OpenRLHF's REINFORCE++ (Hu 2025, arXiv:2501.03262). docs/algorithms.md has the formulas
and why the dense term has its form.
"""
from __future__ import annotations

import torch

from pipeline.core.config import LOSS_TYPES
from pipeline.train.ppo import masked_mean

GROUP_STD_EPS = 1e-4  # TRL's `std_rewards + 1e-4` (GRPO) and `nanstd(advantages) + 1e-4` (RLOO)
WHITEN_VAR_FLOOR = 1e-8  # OpenRLHF's clamp of the batch variance before rsqrt


def _grouped(values: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B,) -> (B / G, G); raises ValueError when B is not a whole number of groups."""
    if group_size < 1 or values.shape[0] % group_size:
        raise ValueError(f"{values.shape[0]} responses are not a whole number of groups of {group_size}.")
    return values.view(-1, group_size)


def group_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group") -> torch.Tensor:
    """GRPO's outcome advantage per response (TRL GRPOTrainer, sum_then_normalize).

    A_i = (r_i − mean_group(r)) / (std + 1e-4), std the Bessel-corrected std of the group ("group"),
    of the whole batch ("batch"), or no division ("none": Dr. GRPO, Liu et al. 2025).
    rewards: (B,). Returns (B,).
    """
    grouped = _grouped(rewards, group_size)  # (B/G, G)
    centred = (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)  # (B,)
    if scale == "none":
        return centred
    if scale == "group":
        std = grouped.std(dim=1, keepdim=True).expand_as(grouped).reshape(-1)  # (B,)
    elif scale == "batch":
        std = rewards.std().expand_as(rewards)  # (B,)
    else:
        raise ValueError(f"Unknown scale {scale!r}: use one of 'group', 'batch', 'none'.")
    return centred / (std + GROUP_STD_EPS)


def rloo_advantages(rewards: torch.Tensor, group_size: int, normalize: bool = False) -> torch.Tensor:
    """RLOO's leave-one-out advantage per response (TRL RLOOTrainer; Ahmadian et al. 2024).

    A_i = r_i − (Σ_group r − r_i) / (G − 1); with normalize, then (A − mean(A)) / (std(A) + 1e-4) over the batch.
    rewards: (B,), G >= 2. Returns (B,).
    """
    grouped = _grouped(rewards, group_size)  # (B/G, G)
    if group_size < 2:
        raise ValueError("RLOO needs at least 2 responses per prompt: a group of one has no baseline.")
    baselines = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)  # (B/G, G)
    advantages = (grouped - baselines).reshape(-1)  # (B,)
    if normalize:
        advantages = (advantages - advantages.mean()) / (advantages.std() + GROUP_STD_EPS)
    return advantages


def sequence_kl_rewards(rewards: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, beta: float) -> torch.Tensor:
    """RLOO's KL as a reward penalty: r_i − β · Σ_t kl_it (TRL RLOOTrainer, k1 = old − ref log-probs).

    rewards: (B,), kl, mask: (B, T). Returns (B,).
    """
    return rewards - beta * (kl * mask).sum(dim=-1)


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator as GRPO's loss term: exp(ref − lp) − (ref − lp) − 1, ≥ 0. (B, T) -> (B, T)."""
    delta = ref_logprobs - logprobs  # (B, T)
    return torch.exp(delta) - delta - 1.0


def return_to_go(rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """G_t = Σ_{k ≥ t} γ^(k−t) r_k over the masked positions; 0 outside the mask. (B, T) -> (B, T)."""
    rewards = rewards * mask  # (B, T)
    running = torch.zeros_like(rewards[:, 0])  # (B,)
    returns = torch.zeros_like(rewards)  # (B, T)
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running  # (B,)
        returns[:, t] = running
    return returns * mask


def dense_advantages(intrinsic_rewards: torch.Tensor, mask: torch.Tensor, weight: float) -> torch.Tensor:
    """The critic's per-token term added to a value-free algorithm's outcome advantage.

    D_t = w · G_t / (rms(G) + 1e-4), G the undiscounted return-to-go of the span rewards, rms over the batch's
    masked tokens. Scaled, never shifted: a response the critic said nothing about gets D = 0, so its update is
    the plain algorithm's (docs/algorithms.md). weight 0 gives exact zeros.
    intrinsic_rewards, mask: (B, T). Returns (B, T).
    """
    if weight == 0:
        return torch.zeros_like(intrinsic_rewards)
    returns = return_to_go(intrinsic_rewards, mask)  # (B, T)
    rms = masked_mean(returns.square(), mask).sqrt()
    return weight * returns / (rms + GROUP_STD_EPS)


def token_advantages(outcome: torch.Tensor, dense: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A_it = outcome_i + D_it on the response tokens, 0 elsewhere. outcome: (B,), dense, mask: (B, T) -> (B, T)."""
    return (outcome[:, None] + dense) * mask


def batch_whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """REINFORCE++'s global batch whitening (OpenRLHF): (x − mean) · rsqrt(max(var, 1e-8)) over the mask.

    var is the biased (÷ n) masked variance. Returns (B, T), 0 outside the mask.
    """
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean).square(), mask)
    return (values - mean) * torch.rsqrt(var.clamp(min=WHITEN_VAR_FLOOR)) * mask


def reinforce_pp_advantages(rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """REINFORCE++: whiten the return-to-go of the per-token rewards over the whole batch.

    rewards: (B, T), already env reward at the last token + critic span rewards − β·KL (ppo.total_rewards).
    Returns (B, T) detached.
    """
    return batch_whiten(return_to_go(rewards, mask, gamma), mask).detach()


def clipped_token_loss(*, logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                       epsilon_low: float, epsilon_high: float, ref_logprobs: torch.Tensor | None = None,
                       beta: float = 0.0) -> torch.Tensor:
    """GRPO's per-token loss (TRL GRPOTrainer._compute_loss, importance_sampling_level "token").

    r = exp(lp − old); −min(r·A, clip(r, 1 − ε_low, 1 + ε_high)·A), plus β · r · k3(lp, ref) when β ≠ 0
    (the factor r is TRL's use_bias_correction_kl, on by default; r is not detached there either).
    advantages: (B, T) or (B, 1). Returns (B, T), not yet masked.
    """
    ratio = torch.exp(logprobs - old_logprobs)  # (B, T)
    clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)  # (B, T)
    loss = -torch.min(ratio * advantages, clipped * advantages)  # (B, T)
    if beta != 0.0:
        loss = loss + beta * k3_kl(logprobs, ref_logprobs) * ratio
    return loss


def aggregate_loss(per_token_loss: torch.Tensor, mask: torch.Tensor, *, loss_type: str, rows: int, tokens: float,
                   max_completion_length: int) -> torch.Tensor:
    """Reduce a per-token loss to the scalar TRL's loss_type defines, over `rows` responses and `tokens` tokens.

    grpo:    Σ_i (Σ_t l_it m_it / Σ_t m_it) / rows            (each response's token mean, averaged)
    dr_grpo: Σ_it l_it m_it / (rows · max_completion_length)  (a constant normaliser)
    dapo:    Σ_it l_it m_it / tokens                          (token mean over the optimizer step)
    `rows` and `tokens` are the whole minibatch's (or step's, for dapo) counts, so a process holding part of the
    rows gets its share of the whole's loss. per_token_loss, mask: (b, T). Returns a scalar tensor.
    """
    if loss_type == "grpo":
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).sum() / rows
    if loss_type == "dr_grpo":
        return (per_token_loss * mask).sum() / (rows * max_completion_length)
    if loss_type == "dapo":
        return (per_token_loss * mask).sum() / max(tokens, 1.0)
    raise ValueError(f"Unknown loss_type {loss_type!r}: use one of {LOSS_TYPES}.")


def sequence_clipped_loss(*, logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                          mask: torch.Tensor, epsilon_low: float, epsilon_high: float) -> torch.Tensor:
    """RLOO's per-response loss (TRL RLOOTrainer._compute_loss): the ratio of whole-sequence probabilities.

    r_i = exp(Σ_t m_it (lp − old)); −min(r_i·A_i, clip(r_i, 1 − ε_low, 1 + ε_high)·A_i).
    logprobs, old_logprobs, mask: (B, T); advantages: (B,). Returns (B,).
    """
    ratio = torch.exp(((logprobs - old_logprobs) * mask).sum(dim=1))  # (B,)
    clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high)  # (B,)
    return -torch.min(ratio * advantages, clipped * advantages)
