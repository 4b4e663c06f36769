"""The value-free algorithms' round (ppo.algorithm grpo, rloo, reinforce_pp): advantages and minibatch loss.

train_round (pipeline/train/trainer.py) runs the same passes, minibatches, optimizer steps and stats for every
algorithm; these two functions are what differs from PPO's GAE and clipped policy + value loss. The formulas are
pipeline/train/group.py's (docs/algorithms.md). Mask convention as pipeline/train/ppo.py; B responses, T positions.
"""
from __future__ import annotations

import torch

from pipeline.core.config import PPOParams
from pipeline.train.group import (
    aggregate_loss,
    clipped_token_loss,
    dense_advantages,
    group_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    sequence_clipped_loss,
    sequence_kl_rewards,
    token_advantages,
)
from pipeline.train.ppo import total_rewards

GROUP_ALGORITHMS = ("grpo", "rloo")  # their baseline is the other responses to the same prompt


def value_free_advantages(params: PPOParams, *, env_rewards: torch.Tensor, kl: torch.Tensor,
                          old_logprobs: torch.Tensor, ref_logprobs: torch.Tensor, intrinsic_rewards: torch.Tensor,
                          mask: torch.Tensor, kl_coef: float, group_size: int) -> dict[str, torch.Tensor]:
    """{"advantages": (B, T) token advantages, "sequence_advantages": (B,) RLOO's outcome part (else zeros)}.

    env_rewards: (B,) after score scaling; kl: (B, T) ppo.kl_penalty's estimate (REINFORCE++'s reward penalty);
    old_logprobs, ref_logprobs, intrinsic_rewards, mask: (B, T). kl_coef = β. Everything detached.
    """
    zeros = torch.zeros_like(env_rewards)  # (B,)
    if params.algorithm == "reinforce_pp":
        rewards, _ = total_rewards(env_rewards=env_rewards, kl=kl, intrinsic_rewards=intrinsic_rewards, mask=mask,
                                   kl_coef=kl_coef)  # (B, T)
        return {"advantages": reinforce_pp_advantages(rewards, mask, params.gamma), "sequence_advantages": zeros}
    dense = dense_advantages(intrinsic_rewards, mask, params.dense_weight)  # (B, T)
    if params.algorithm == "grpo":
        scale = "none" if params.loss_type == "dr_grpo" else "group"
        outcome = group_advantages(env_rewards, group_size, scale)  # (B,)
        return {"advantages": token_advantages(outcome, dense, mask).detach(), "sequence_advantages": zeros}
    if params.algorithm == "rloo":  # the KL is a k1 reward penalty, the outcome a sequence-level loss
        rewards = sequence_kl_rewards(env_rewards, old_logprobs - ref_logprobs, mask, kl_coef)  # (B,)
        return {"advantages": (dense * mask).detach(),
                "sequence_advantages": rloo_advantages(rewards, group_size).detach()}
    raise ValueError(f"ppo.algorithm {params.algorithm!r} is not value-free.")


def value_free_loss(params: PPOParams, *, logprobs: torch.Tensor, tensors: dict[str, torch.Tensor], mask: torch.Tensor,
                    kl_coef: float, rows: int, tokens: float, max_completion_length: int) -> torch.Tensor:
    """This process's share of the minibatch loss, before the gradient-accumulation division.

    logprobs (b, T) with grad; tensors: this process's rows of old_logprobs, ref_logprobs, advantages (b, T) and
    sequence_advantages (b,); rows: responses in the whole minibatch; tokens: response tokens in it (for dapo:
    in the whole optimizer step divided by ppo.gradient_accumulation_steps, so the step is TRL's one token mean).
    tensors["is_weights"] (b, T), when present (an external engine's rollouts, ppo.engine_is_cap): the truncated
    importance-sampling weights each per-token loss is multiplied by (RLOO's sequence-level outcome loss is not).
    """
    eps = params.cliprange
    if params.algorithm == "grpo":
        per_token = clipped_token_loss(logprobs=logprobs, old_logprobs=tensors["old_logprobs"],
                                       advantages=tensors["advantages"], epsilon_low=eps, epsilon_high=eps,
                                       ref_logprobs=tensors["ref_logprobs"], beta=kl_coef)  # (b, T)
        return aggregate_loss(_weighted(per_token, tensors), mask, loss_type=params.loss_type, rows=rows,
                              tokens=tokens, max_completion_length=max_completion_length)
    per_token = _weighted(clipped_token_loss(logprobs=logprobs, old_logprobs=tensors["old_logprobs"],
                                             advantages=tensors["advantages"], epsilon_low=eps,
                                             epsilon_high=eps), tensors)  # (b, T)
    if params.algorithm == "reinforce_pp":  # a token mean over the minibatch, as PPO's policy loss
        return (per_token * mask).sum() / tokens
    # rloo: TRL's sequence-level loss on the outcome, plus the dense term's token loss per response (grpo's mean)
    outcome = sequence_clipped_loss(logprobs=logprobs, old_logprobs=tensors["old_logprobs"], mask=mask,
                                    advantages=tensors["sequence_advantages"], epsilon_low=eps, epsilon_high=eps)
    dense = aggregate_loss(per_token, mask, loss_type="grpo", rows=rows, tokens=tokens,
                           max_completion_length=max_completion_length)
    return outcome.sum() / rows + dense


def _weighted(per_token: torch.Tensor, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """per_token · tensors["is_weights"] when an engine's rollouts are corrected, else per_token itself. (b, T)."""
    weights = tensors.get("is_weights")
    return per_token if weights is None else per_token * weights
