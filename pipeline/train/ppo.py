"""The PPO math: pure functions over tensors, named after legacy TRL (0.11.4) symbols.

Shapes: B = responses in the batch, T = response positions (padded), V = vocabulary.
Mask convention for this whole module: `mask` is a (B, T) tensor of 0s and 1s, 1 = response token,
0 = padding, of any dtype (float, bf16, integer or bool give the same numbers). Every reduction is
over the mask only, so a padded position never changes a result, and right padding, left padding or
extra padding give the same numbers. A mask holding any other value (0.5, 2, NaN) raises ValueError
in every function here that takes one (check_mask): masked_mean divides by Σ mask, so a weighted mask
would silently give a wrongly normalised weighted mean.

No model, optimizer or config object is imported here; the trainer wires these together.
"""
from __future__ import annotations

import torch

WHITEN_EPS = 1e-8  # TRL's masked_whiten epsilon


def check_mask(mask: torch.Tensor) -> None:
    """Raise ValueError naming the offending values unless `mask` holds only 0 and 1 (any dtype).

    One pass over (B, T) and one host sync; a bool mask is 0/1 by construction and is not scanned.
    """
    if mask.dtype == torch.bool:
        return
    not_binary = (mask != 0) & (mask != 1)  # (B, T); NaN counts as not binary
    if not_binary.any():
        bad = mask[not_binary].float().unique()  # sorted, NaN last
        shown = ", ".join(str(v) for v in bad[:5].tolist()) + (", ..." if bad.numel() > 5 else "")
        raise ValueError(
            f"A PPO mask must hold only 0 (padding) and 1 (response token), got {int(not_binary.sum())} "
            f"position(s) holding {shown}: build the mask as a bool or 0/1 tensor (a weighted mask would make "
            f"masked_mean a weighted mean divided by the sum of the weights)."
        )


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Mean of `values` over the positions where `mask` is 1.

    mean = Σ (values · mask) / Σ mask, over all positions or along `axis`.
    Masked positions are replaced by 0 before the sum, so even a NaN there is ignored.
    Returns a scalar tensor (or one value per remaining axis). Raises ValueError for a mask that is not 0/1.
    """
    check_mask(mask)
    kept = torch.where(mask.bool(), values, torch.zeros_like(values))  # (B, T)
    if axis is None:
        return kept.sum() / mask.sum()
    return kept.sum(axis) / mask.sum(axis)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over the masked positions, Bessel-corrected like TRL by default.

    var = masked_mean((values − mean)²) · n / (n − 1), n = Σ mask.
    Raises ValueError when fewer than two positions are unmasked (the unbiased variance is
    undefined; TRL divided by zero there).
    """
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        n = mask.sum()
        if n < 2:
            raise ValueError(f"masked_var needs at least 2 unmasked positions, got {int(n)}.")
        variance = variance * n / (n - 1)
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Normalise `values` to zero mean, unit variance over the mask.

    whitened = (values − mean) / sqrt(var + 1e-8); with shift_mean=False the mean is added
    back (only the scale changes). Positions outside the mask are set to 0 (TRL left them
    holding arbitrary numbers; they are never read).
    Returns a (B, T) tensor.
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + WHITEN_EPS)  # (B, T)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * mask  # (B, T)


def kl_penalty(
    *,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    kind: str,
    logits: torch.Tensor | None = None,
    ref_logits: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token KL estimate between the policy and the reference model.

    kind "kl":   lp − ref                      (k1, unbiased, can be negative)
    kind "abs":  |lp − ref|
    kind "mse":  ½ (lp − ref)²
    kind "full": Σ_v p(v) (log p(v) − log q(v)) from the full logits (B, T, V) of both models.
    logprobs, ref_logprobs: (B, T) log-probs of the sampled tokens. Returns (B, T).
    Raises ValueError for an unknown kind or "full" without logits.
    """
    if kind == "kl":
        return logprobs - ref_logprobs  # (B, T)
    if kind == "abs":
        return (logprobs - ref_logprobs).abs()  # (B, T)
    if kind == "mse":
        return 0.5 * (logprobs - ref_logprobs).square()  # (B, T)
    if kind == "full":
        if logits is None or ref_logits is None:
            raise ValueError("kl_penalty kind 'full' needs logits and ref_logits (B, T, V).")
        log_p = torch.log_softmax(logits.float(), dim=-1)  # (B, T, V)
        log_q = torch.log_softmax(ref_logits.float(), dim=-1)  # (B, T, V)
        return (log_p.exp() * (log_p - log_q)).sum(-1)  # (B, T)
    raise ValueError(f"Unknown kl_penalty kind {kind!r}: use one of 'kl', 'abs', 'mse', 'full'.")


def total_rewards(
    *,
    env_rewards: torch.Tensor,
    kl: torch.Tensor,
    intrinsic_rewards: torch.Tensor,
    mask: torch.Tensor,
    kl_coef: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-token reward PPO optimises: KL penalty + intrinsic (critic) reward + the env reward at the end.

    kl_rewards_t = −kl_coef · kl_t   (TRL's non_score_reward)
    rewards_t = kl_rewards_t + intrinsic_rewards_t, plus env_rewards[b] at the last response token.
    env_rewards: (B,) after scale_scores; kl, intrinsic_rewards, mask: (B, T). Everything outside the mask is 0.
    Returns (rewards (B, T), kl_rewards (B, T)).
    Raises ValueError for a mask that is not 0/1, or one with a row of no response tokens (its env reward
    would have nowhere to go).
    """
    check_mask(mask)
    empty = (mask.sum(dim=1) == 0).nonzero().flatten().tolist()  # rows with no response token
    if empty:
        raise ValueError(f"total_rewards: mask row(s) {empty} have no response token, so their env reward has no "
                         f"last token to go on: every response needs at least one unmasked position.")
    kl_rewards = -kl_coef * kl * mask  # (B, T)
    rewards = kl_rewards + intrinsic_rewards * mask  # (B, T)
    # integer positions 1..T: in the mask's own dtype, bf16 rounds them above 256 and argmax could pick a neighbour
    positions = torch.arange(1, mask.shape[1] + 1, device=mask.device)  # (T,) long
    last = (mask.long() * positions).argmax(dim=1)  # (B,) index of the last response token
    env_at_end = torch.zeros_like(rewards)  # (B, T)
    env_at_end[torch.arange(rewards.shape[0]), last] = env_rewards.to(rewards.dtype)
    return rewards + env_at_end, kl_rewards


def token_kl_rewards(algorithm: str, *, kl: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor,
                     ref_logprobs: torch.Tensor | None, kl_coef: float) -> list[list[float] | None]:
    """Per response, the KL part of each response token's reward, as the round's rewards use it.

    ppo, reinforce_pp: −β·kl_t, total_rewards' kl_rewards (kl = kl_penalty's estimate, β = the round's kl_coef);
    rloo: −β·(old_t − ref_t), the per-token terms of its sequence-level k1 penalty (they sum to it);
    grpo: None, its KL is a k3 loss term, not part of any reward.
    kl, old_logprobs, mask, ref_logprobs: (B, T). Returns B lists of each response's mask.sum() values.
    """
    check_mask(mask)
    if algorithm == "grpo":
        return [None] * mask.shape[0]
    per_token = kl if algorithm != "rloo" else old_logprobs - ref_logprobs  # (B, T)
    values = -kl_coef * per_token * mask  # (B, T)
    return [row[: int(n)].tolist() for row, n in zip(values.cpu(), mask.sum(-1).tolist())]


def gae(
    *,
    values: torch.Tensor,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
    whiten_rewards: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation as TRL's compute_advantages.

    Values and rewards are masked first (a padded V_{t+1} counts as 0), then backwards in t:
        delta_t = r_t + γ V_{t+1} − V_t
        lastgaelam = delta_t + γ λ lastgaelam,   A_t = lastgaelam
    returns R_t = A_t + V_t (the value target, before whitening);
    advantages are then whitened over the mask. Both are detached and 0 outside the mask.
    whiten_rewards: scale rewards to unit variance over the mask first (mean kept).
    values, rewards, mask: (B, T). Returns (advantages (B, T), returns (B, T)).
    """
    values = values * mask  # (B, T)
    rewards = rewards * mask  # (B, T)
    if whiten_rewards:
        rewards = masked_whiten(rewards, mask, shift_mean=False)  # (B, T)
    lastgaelam = torch.zeros_like(values[:, 0])  # (B,)
    advantages_reversed = []
    gen_len = values.shape[1]
    for t in reversed(range(gen_len)):
        nextvalues = values[:, t + 1] if t < gen_len - 1 else torch.zeros_like(values[:, t])  # (B,)
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]  # (B,)
        lastgaelam = delta + gamma * lam * lastgaelam  # (B,)
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)  # (B, T)
    returns = (advantages + values) * mask  # (B, T)
    advantages = masked_whiten(advantages, mask)  # (B, T)
    return advantages.detach(), returns.detach()


def policy_loss(
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cliprange: float,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate policy loss.

    logratio = logprobs − old_logprobs, ratio = exp(logratio)
    pg_losses = −A · ratio,  pg_losses2 = −A · clip(ratio, 1 − cliprange, 1 + cliprange)
    pg_loss = masked_mean(max(pg_losses, pg_losses2))
    is_weights: (B, T) truncated importance-sampling weights of an external engine's rollouts
    (:func:`truncated_is_weights`): pg_loss = masked_mean(w · max(pg_losses, pg_losses2)); None = no weights,
    the line above unchanged.
    stats: clipfrac = masked_mean(pg_losses2 > pg_losses),
           approx_kl = masked_mean((ratio − 1) − logratio)   (k3, ≥ 0),
           policy_kl = masked_mean(old_logprobs − logprobs)   (k1),
           ratio_mean = masked_mean(ratio).
    All tensors (B, T). Returns (pg_loss scalar tensor with grad, stats of python floats).
    """
    logratio = logprobs - old_logprobs  # (B, T)
    ratio = torch.exp(logratio)  # (B, T)
    pg_losses = -advantages * ratio  # (B, T)
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)  # (B, T)
    per_token = torch.max(pg_losses, pg_losses2)  # (B, T)
    if is_weights is not None:
        per_token = per_token * is_weights  # (B, T)
    pg_loss = masked_mean(per_token, mask)
    with torch.no_grad():
        stats = {
            "clipfrac": masked_mean(torch.gt(pg_losses2, pg_losses).float(), mask).item(),
            "approx_kl": masked_mean((ratio - 1.0) - logratio, mask).item(),
            "policy_kl": masked_mean(-logratio, mask).item(),
            "ratio_mean": masked_mean(ratio, mask).item(),
        }
    return pg_loss, stats


def truncated_is_weights(*, old_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, mask: torch.Tensor,
                         cap: float) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance sampling (TIS) of an external engine's rollouts against the trainer's old log-probs.

    The engine (vLLM) sampled from its own numbers μ, the loss assumes the trainer's π_old; each token's
    policy-gradient loss is reweighted by
        w_t = min(exp(old_t − engine_t), cap)   (π_old / μ, truncated at `cap`; detached)
    stats: is_capped_share = masked_mean(exp(old − engine) > cap), is_weight_mean = masked_mean(w).
    old_logprobs, engine_logprobs, mask: (B, T). Returns (w (B, T), 0 outside the mask; stats).
    Raises ValueError for cap <= 0 or a mask that is not 0/1.
    """
    if not cap > 0:
        raise ValueError(f"truncated_is_weights: cap must be > 0, got {cap}.")
    check_mask(mask)
    with torch.no_grad():
        ratio = torch.exp(old_logprobs.float() - engine_logprobs.float())  # (B, T)
        weights = torch.clamp(ratio, max=cap) * mask  # (B, T)
        stats = {"is_capped_share": masked_mean((ratio > cap).float(), mask).item(),
                 "is_weight_mean": masked_mean(weights, mask).item()}
    return weights.detach(), stats


def value_loss(
    *,
    vpreds: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    cliprange_value: float,
) -> tuple[torch.Tensor, float]:
    """Clipped value loss.

    vpredclipped = clip(vpreds, old_values − cliprange_value, old_values + cliprange_value)
    vf_loss = ½ masked_mean(max((vpreds − R)², (vpredclipped − R)²))
    vf_clipfrac = masked_mean((vpredclipped − R)² > (vpreds − R)²)
    All tensors (B, T). Returns (vf_loss scalar tensor with grad, vf_clipfrac float).
    """
    vpredclipped = torch.clamp(vpreds, old_values - cliprange_value, old_values + cliprange_value)  # (B, T)
    vf_losses1 = (vpreds - returns) ** 2  # (B, T)
    vf_losses2 = (vpredclipped - returns) ** 2  # (B, T)
    vf_loss = 0.5 * masked_mean(torch.max(vf_losses1, vf_losses2), mask)
    vf_clipfrac = masked_mean(torch.gt(vf_losses2, vf_losses1).float(), mask).item()
    return vf_loss, vf_clipfrac


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax distribution at each position.

    H = logsumexp(z) − Σ_v softmax(z)_v z_v, computed in fp32. logits (B, T, V) -> (B, T).
    """
    logits = logits.float()  # (B, T, V)
    probs = torch.softmax(logits, dim=-1)  # (B, T, V)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)  # (B, T)


def ratio_exceeds(ratio_mean: float, ratio_threshold: float) -> bool:
    """True when a minibatch's mean ratio is above the threshold: the caller skips it.

    TRL multiplied such a loss by 0 and warned (Adam still stepped on momentum); drlc skips
    the backward pass and records the minibatch in `ppo/skipped`.
    """
    return ratio_mean > ratio_threshold


class FixedKLController:
    """A constant KL coefficient β."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Keep β unchanged (the signature matches AdaptiveKLController)."""

    def state_dict(self) -> dict:
        return {"kind": "fixed", "value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Proportional controller steering the summed KL towards `target` (Ziegler et al. 2019).

    e = clip(current_kl / target − 1, −0.2, 0.2);  β ← β · (1 + e · n_steps / horizon).
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: float):
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move β after a batch of `n_steps` responses whose mean summed KL was `current_kl`."""
        proportional_error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon

    def state_dict(self) -> dict:
        return {"kind": "adaptive", "value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])
        self.target = float(state["target"])
        self.horizon = float(state["horizon"])


class RunningMoments:
    """Running mean and std of all env rewards seen so far (parallel-variance merge, as TRL).

    Starts at mean 0, var 1, std 1 and a vanishing count (1e-24), so the first batch
    effectively replaces the prior. `std` is the unbiased running standard deviation.
    """

    def __init__(self):
        self.mean = 0.0
        self.std = 1.0
        self.var = 1.0
        self.count = 1e-24

    def update(self, xs: torch.Tensor) -> tuple[float, float]:
        """Merge a batch `xs` (N,) into the running moments.

        Returns the batch's (mean, unbiased std); the std of a single value is reported as 0.
        """
        xs = xs.detach().double().flatten()  # (N,)
        xs_count = xs.numel()
        xs_mean = xs.mean().item()
        xs_var = xs.var(unbiased=False).item()
        delta = xs_mean - self.mean
        tot_count = self.count + xs_count
        new_sum = xs_var * xs_count
        old_sum = self.var * self.count + delta**2 * self.count * xs_count / tot_count
        self.mean += delta * xs_count / tot_count
        self.var = (old_sum + new_sum) / tot_count
        self.std = (self.var * tot_count / (tot_count - 1)) ** 0.5
        self.count = tot_count
        batch_std = (xs_var * xs_count / (xs_count - 1)) ** 0.5 if xs_count > 1 else 0.0
        return xs_mean, batch_std

    def state_dict(self) -> dict:
        return {"mean": self.mean, "std": self.std, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.std = float(state["mean"]), float(state["std"])
        self.var, self.count = float(state["var"]), float(state["count"])


def scale_scores(
    *,
    scores: torch.Tensor,
    moments: RunningMoments,
    use_score_scaling: bool,
    use_score_norm: bool,
    score_clip: float | None,
) -> torch.Tensor:
    """Scale, normalise and clip the environment rewards as TRL's step did.

    "score" is TRL's word for the environment reward; this function, its options and the running
    moments keep it because the options are params keys (ppo.use_score_scaling, ppo.use_score_norm,
    ppo.score_clip) and the moments are saved as trainer_state.json's "score_moments".
    With use_score_scaling: update `moments` with the batch, then
        scores / (std + eps), or (scores − mean) / (std + eps) when use_score_norm too,
    using the running moments after the update (eps = machine epsilon of the dtype).
    use_score_norm alone does nothing (as TRL). Then clip to [−score_clip, score_clip].
    scores: (B,). Returns (B,).
    """
    if use_score_scaling:
        moments.update(scores)
        factor = moments.std + torch.finfo(scores.dtype).eps
        if use_score_norm:
            scores = (scores - moments.mean) / factor  # (B,)
        else:
            scores = scores / factor  # (B,)
    if score_clip is not None:
        scores = torch.clamp(scores, -score_clip, score_clip)  # (B,)
    return scores
