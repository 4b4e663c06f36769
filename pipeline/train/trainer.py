"""One PPO round over a batch of recorded rollouts (legacy TRL 0.11.4 PPOTrainer.step semantics).

Mask convention: `mask` (B, T) float, 1 = response token, 0 = padding.
Dropout: drlc keeps the policy in eval mode (dropout off) for sampling, the log-prob passes and
the loss pass. TRL 0.11.4 did the same in effect (batched_forward_pass calls model.eval() before
every forward, the loss pass included; train_minibatch's model.train() comes after it), and newer
TRL disables dropout outright. The first minibatch's ratio is then 1 up to float error, and
`policy_kl` starts at 0.
Mixed precision: with params.mixed_precision == "bf16" every model forward runs under bf16
autocast (the backward follows the dtypes autocast chose); log-probs, values, KL, rewards,
advantages and losses are fp32 (see pipeline.model.logprobs.response_logprobs).
Data parallel: with a `DataParallel` (pipeline.parallel.distributed, an accelerate.Accelerator) each process
runs the forward passes on its share of the rows and of every minibatch; per-token tensors are gathered, minibatch
statistics summed with token weights, and gradients averaged by the prepared model (DDP all-reduce,
FSDP2 reduce-scatter, the DeepSpeed ZeRO engine's reduction) with token-weighted losses, so N
processes make the update one process makes
on the whole batch. One process runs the same code with a `SingleProcess` (pipeline.parallel.single),
whose share is the whole batch, whose gathers and sums return their input and whose token share is 1.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from pipeline.core.atomic import atomic_file, write_text
from pipeline.core.config import PPOParams
from pipeline.core.errors import DataError, PPOInputError
from pipeline.core.round_metrics import intrinsic_reward_sum
from pipeline.model.logprobs import response_logprobs
from pipeline.model.policy import PolicyWithValueHead
from pipeline.parallel.distributed import DataParallel
from pipeline.parallel.single import SingleProcess
from pipeline.train.ppo import (
    gae,
    kl_penalty,
    masked_mean,
    policy_loss,
    ratio_exceeds,
    scale_scores,
    token_kl_rewards,
    total_rewards,
    truncated_is_weights,
    value_loss,
)
from pipeline.train.value_free import GROUP_ALGORITHMS, value_free_advantages, value_free_loss

PAD_ID = 0  # right padding sits after every real token and is masked, so its id is irrelevant


@dataclass(frozen=True)
class RolloutBatch:
    """One round's rollouts as python lists, one entry per response."""

    query_ids: list[list[int]]
    response_ids: list[list[int]]
    behaviour_logprobs: list[list[float]]  # log-prob of each response token when sampled
    env_rewards: list[float]  # environment reward per response as PPO reads it (scores table: env_reward_shaped)
    intrinsic_rewards: list[list[float]]  # critic reward per response token (annotations table: token_rewards)
    # an external engine's log-probs of the response tokens (rollouts.engine_logprobs, rollout.engine vllm); when
    # set, the old log-probs are recomputed by the training model and the gap to these is recorded
    engine_logprobs: list[list[float]] | None = None


def _finite(values) -> bool:
    return all(math.isfinite(v) for v in values)


def validate_batch(batch: RolloutBatch, params: PPOParams, world_size: int = 1, group_size: int = 1) -> None:
    """Raise PPOInputError naming the first malformed part of `batch`; touches no model.

    world_size: number of data-parallel processes; each takes an equal share of every minibatch.
    group_size: responses per prompt (consecutive rows); grpo and rloo need at least 2.
    """
    n = len(batch.response_ids)
    if n == 0:
        raise PPOInputError("The PPO batch is empty: the rollout produced no responses.")
    if params.algorithm in GROUP_ALGORITHMS and (group_size < 2 or n % group_size):
        raise PPOInputError(f"ppo.algorithm = {params.algorithm} needs whole groups of at least 2 responses per "
                            f"prompt, but the batch has {n} rows in groups of {group_size}: set "
                            f"rollout.samples_per_prompt >= 2 dividing rollout.batch_size.")
    engine = ("engine_logprobs",) if batch.engine_logprobs is not None else ()
    for name in ("query_ids", "behaviour_logprobs", "env_rewards", "intrinsic_rewards") + engine:
        if len(getattr(batch, name)) != n:
            rows = len(getattr(batch, name))
            raise PPOInputError(f"RolloutBatch.{name} has {rows} rows but there are {n} responses.")
    if n % params.backward_batch_size:
        raise PPOInputError(
            f"Batch size {n} is not divisible by mini_batch_size·gradient_accumulation_steps = "
            f"{params.backward_batch_size}: change ppo.mini_batch_size or rollout.batch_size."
        )
    if params.mini_batch_size % world_size:
        raise PPOInputError(
            f"ppo.mini_batch_size = {params.mini_batch_size} is not divisible by the {world_size} data-parallel "
            f"processes (each takes an equal share of every minibatch): make ppo.mini_batch_size a multiple "
            f"of {world_size} or launch a number of processes that divides it."
        )
    for i in range(n):
        length = len(batch.response_ids[i])
        if length == 0 or len(batch.query_ids[i]) == 0:
            raise PPOInputError(f"Row {i} has an empty query or response: every row needs both.")
        for name in ("behaviour_logprobs", "intrinsic_rewards") + engine:
            if len(getattr(batch, name)[i]) != length:
                raise PPOInputError(
                    f"Row {i}: {name} has {len(getattr(batch, name)[i])} values for {length} response tokens."
                )
            if not _finite(getattr(batch, name)[i]):
                raise PPOInputError(f"Row {i}: {name} contains NaN or inf.")
        if not math.isfinite(batch.env_rewards[i]):
            raise PPOInputError(f"Row {i}: env reward {batch.env_rewards[i]} is not finite.")
    if sum(len(r) for r in batch.response_ids) < 2:
        raise PPOInputError("The batch has fewer than 2 response tokens: advantages cannot be whitened.")


def _padded(rows: list[list[float]], width: int, device) -> torch.Tensor:
    padded = [list(r) + [0.0] * (width - len(r)) for r in rows]
    return torch.tensor(padded, dtype=torch.float32, device=device)  # (B, T)


def _subset(batch: RolloutBatch, rows: list[int]) -> RolloutBatch:
    return RolloutBatch(*(None if getattr(batch, f) is None else [getattr(batch, f)[i] for i in rows]
                          for f in RolloutBatch.__dataclass_fields__))


@torch.no_grad()
def _forward_no_grad(model, batch: RolloutBatch, width: int, chunk: int, keep_logits: bool, mixed_precision: str):
    """Log-probs, values, mask (and logits if asked) for the whole batch, in chunks, eval mode."""
    model.eval()
    parts = [
        response_logprobs(
            model, query_ids=batch.query_ids[s : s + chunk], response_ids=batch.response_ids[s : s + chunk],
            pad_id=PAD_ID, width=width, mixed_precision=mixed_precision, keep_logits=keep_logits,
        )
        for s in range(0, len(batch.response_ids), chunk)
    ]
    logprobs, values, mask = (torch.cat([getattr(p, k) for p in parts]) for k in ("logprobs", "values", "mask"))
    logits = torch.cat([p.logits for p in parts]) if keep_logits else None  # (B, T, V)
    return logprobs, values, mask, logits


def _no_grad_passes(policy, ref_model, batch: RolloutBatch, width: int, params: PPOParams) -> dict:
    """Fresh log-probs, old values, mask and per-token KL of `batch`'s rows, all (B, T) fp32.

    One no-grad pass per model in chunks of mini_batch_size (eval mode), as TRL's step. KL uses
    the old log-probs (:func:`old_logprobs_of`) as the policy's (see docs/ppo.md, item 1).
    """
    full_kl, chunk, precision = params.kl_penalty == "full", params.mini_batch_size, params.mixed_precision
    logprobs, values, mask, logits = _forward_no_grad(policy, batch, width, chunk, full_kl, precision)
    ref_logprobs, _, _, ref_logits = _forward_no_grad(ref_model, batch, width, chunk, full_kl, precision)
    old_logprobs = old_logprobs_of(batch, fresh_logprobs=logprobs, width=width)  # (B, T)
    kl = kl_penalty(logprobs=old_logprobs, ref_logprobs=ref_logprobs, kind=params.kl_penalty,
                    logits=logits, ref_logits=ref_logits) * mask  # (B, T)
    passes = {"logprobs": logprobs, "values": values, "mask": mask, "kl": kl}
    if params.algorithm != "ppo":  # GRPO's k3 loss term and RLOO's k1 reward penalty read the reference log-probs
        passes["ref_logprobs"] = ref_logprobs
    return passes


def old_logprobs_of(batch: RolloutBatch, *, fresh_logprobs: torch.Tensor, width: int) -> torch.Tensor:
    """PPO's old log-probs (B, T): the recorded behaviour log-probs of drlc's sampler (the training model's own
    numbers), or, for an external engine's rollouts (batch.engine_logprobs set), the training model's fresh
    no-grad log-probs (B, T) of the same tokens: vLLM's kernels and precision give other numbers."""
    if batch.engine_logprobs is not None:
        return fresh_logprobs
    return _padded(batch.behaviour_logprobs, width, fresh_logprobs.device)  # (B, T)


def engine_logprob_gap(*, old_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, mask: torch.Tensor) -> dict:
    """The gap between the recomputed old log-probs and the engine's, over response tokens (mask 1):
    engine_logprob_gap_max = max |Δ|, engine_logprob_gap_mean = Σ mask·|Δ| / Σ mask. All (B, T)."""
    gap = (old_logprobs - engine_logprobs).abs() * mask  # (B, T)
    return {"engine_logprob_gap_max": gap.max().item(), "engine_logprob_gap_mean": (gap.sum() / mask.sum()).item()}


def engine_correction(params: PPOParams, *, old_logprobs: torch.Tensor, engine_logprobs: torch.Tensor,
                      mask: torch.Tensor, tensors: dict) -> dict:
    """The engine/trainer gap of an external engine's rollouts, checked and corrected (docs/ppo.md).

    Stats: engine_logprob_gap_max / _mean (:func:`engine_logprob_gap`); with ppo.engine_is_cap set, the truncated
    importance-sampling weights (pipeline/train/ppo.py truncated_is_weights) go into tensors["is_weights"], which
    the losses multiply, and their is_capped_share, is_weight_mean join the stats. All (B, T).
    Raises PPOInputError when the mean gap is above ppo.engine_gap_max (the engine samples another model).
    """
    stats = engine_logprob_gap(old_logprobs=old_logprobs, engine_logprobs=engine_logprobs, mask=mask)
    if stats["engine_logprob_gap_mean"] > params.engine_gap_max:
        raise PPOInputError(
            f"The rollout engine's log-probs are {stats['engine_logprob_gap_mean']:.4g} nats from the trainer's on "
            f"average (max {stats['engine_logprob_gap_max']:.4g}), above ppo.engine_gap_max = {params.engine_gap_max}:"
            " the engine samples another model or precision than the trainer; check rollout.vllm_args dtype and "
            "ppo.mixed_precision, or raise ppo.engine_gap_max.")
    if params.engine_is_cap is None:
        return stats
    tensors["is_weights"], is_stats = truncated_is_weights(old_logprobs=old_logprobs, engine_logprobs=engine_logprobs,
                                                           mask=mask, cap=params.engine_is_cap)
    return {**stats, **is_stats}


def make_optimizer(policy: PolicyWithValueHead, learning_rate: float) -> torch.optim.Adam:
    """Adam over the policy's trainable parameters (a list, never a one-shot iterator), as TRL.

    torch's fused Adam: the same update in one kernel per step (8x faster than the default
    per-parameter loop for GPT-2 small on CPU; it agrees with it to float rounding, 1.5e-8).
    """
    return torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=learning_rate, fused=True)


def train_round(
    *,
    policy: PolicyWithValueHead,
    ref_model: PolicyWithValueHead,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    params: PPOParams,
    kl_controller,
    score_moments,
    seed: int,
    progress: bool = True,
    data_parallel: DataParallel | SingleProcess | None = None,
    group_size: int = 1,
    max_completion_length: int | None = None,
    kl_rewards: list | None = None,
) -> list[dict]:
    """Run `ppo_epochs` of PPO over one batch of rollouts; return one stats dict per optimizer step.

    kl_rewards: a list to receive, per response in batch order, the KL part of its per-token reward
    (token_kl_rewards: what `drlc view` shades and the kl_rewards table stores).

    params.algorithm other than "ppo": the same passes, minibatches and steps with a value-free advantage and
    loss (pipeline/train/value_free.py); group_size = responses per prompt (consecutive rows),
    max_completion_length = dr_grpo's constant normaliser (the rollout's max_new_tokens; None = the batch width).

    Updates `policy`, `optimizer`, `kl_controller` and `score_moments` in place.
    data_parallel: None or a SingleProcess for one process. Otherwise `policy` and `optimizer` are
    the ones `data_parallel.prepare` returned, every process passes the same whole `batch`, runs the
    forward passes on its share of it, and ends with the same weights, optimizer state and stats as a single process
    would (up to float summation order).
    Raises PPOInputError for a malformed batch (or a minibatch that does not split evenly over the
    processes) before any model is touched.
    """
    dp = SingleProcess() if data_parallel is None else data_parallel
    validate_batch(batch, params, dp.world_size, group_size)
    n, width = len(batch.response_ids), max(len(r) for r in batch.response_ids)
    # fresh log-probs, old values and per-token KL: one no-grad pass per model per round; each
    # process takes its rows and the (B, T) results are gathered in row order
    mine = _no_grad_passes(policy, ref_model, _subset(batch, dp.shard(range(n))), width, params)
    passes = {key: dp.gather_rows(tensor) for key, tensor in mine.items()}
    current_logprobs, old_values, mask, kl = passes["logprobs"], passes["values"], passes["mask"], passes["kl"]
    # old log-probs = the recorded behaviour log-probs (the gap to a fresh pass should be float noise), or
    # the fresh pass itself for an external engine's rollouts, whose gap to the engine's numbers is recorded
    old_logprobs = old_logprobs_of(batch, fresh_logprobs=current_logprobs, width=width)  # (B, T)
    behaviour_logprobs = _padded(batch.behaviour_logprobs, width, mask.device)  # (B, T)
    behaviour_gap = ((current_logprobs - behaviour_logprobs).abs() * mask).max().item()
    # score scaling / clipping (every process holds every env reward: the moments see the whole batch)
    env_rewards = torch.tensor(batch.env_rewards, dtype=torch.float32, device=mask.device)  # (B,)
    scaled = scale_scores(scores=env_rewards, moments=score_moments, use_score_scaling=params.use_score_scaling,
                          use_score_norm=params.use_score_norm, score_clip=params.score_clip)  # (B,)
    # total per-token rewards: (scaled) env reward at the end + intrinsic critic rewards − β·KL
    kl_coef = kl_controller.value
    intrinsic_rewards = _padded(batch.intrinsic_rewards, width, mask.device)  # (B, T)
    rewards, _ = total_rewards(env_rewards=scaled, kl=kl, intrinsic_rewards=intrinsic_rewards, mask=mask,
                               kl_coef=kl_coef)  # (B, T)
    if kl_rewards is not None:
        kl_rewards.extend(token_kl_rewards(params.algorithm, kl=kl, old_logprobs=old_logprobs, mask=mask,
                                           ref_logprobs=passes.get("ref_logprobs"), kl_coef=kl_coef))
    tensors = {"old_logprobs": old_logprobs, "old_values": old_values, "mask": mask}
    if params.algorithm == "ppo":
        # GAE and advantage whitening over the whole batch (also data parallel: global whitening)
        tensors["advantages"], tensors["returns"] = gae(
            values=old_values, rewards=rewards, mask=mask, gamma=params.gamma, lam=params.lam,
            whiten_rewards=params.whiten_rewards)  # (B, T) each
    else:  # value-free: every process holds the whole batch's rewards, so groups and whitening are global
        tensors.update(value_free_advantages(
            params, env_rewards=scaled, kl=kl, old_logprobs=old_logprobs, ref_logprobs=passes["ref_logprobs"],
            intrinsic_rewards=intrinsic_rewards, mask=mask, kl_coef=kl_coef, group_size=group_size))
        tensors.update(ref_logprobs=passes["ref_logprobs"], kl_coef=kl_coef,
                       max_completion_length=max_completion_length or width)
    round_stats = {  # names: docs/metrics.md
        "kl": kl.sum(-1).mean().item(),
        "kl_coef": kl_coef,
        "env_reward_shaped_mean": env_rewards.mean().item(),  # before ppo.use_score_scaling / score_clip
        "intrinsic_reward_sum": intrinsic_reward_sum(batch.intrinsic_rewards),
        "behaviour_logprob_gap": behaviour_gap,
    }
    if batch.engine_logprobs is not None:
        round_stats.update(engine_correction(params, old_logprobs=old_logprobs, mask=mask, tensors=tensors,
                                             engine_logprobs=_padded(batch.engine_logprobs, width, mask.device)))
    # ppo_epochs of shuffled minibatches, one optimizer step per backward batch
    generator = torch.Generator().manual_seed(seed)  # same seed in every process: same minibatches
    policy.eval()  # dropout off in the loss pass too: see the module docstring
    steps, early_stop = [], False
    n_steps = params.ppo_epochs * (n // params.backward_batch_size)
    bar = _progress(n_steps, progress and dp.is_main)
    for epoch in range(params.ppo_epochs):
        order = torch.randperm(n, generator=generator).tolist()
        for start in range(0, n, params.backward_batch_size):
            indices = order[start : start + params.backward_batch_size]
            step = _optimizer_step(policy, optimizer, batch, tensors, indices, params, width, dp)
            steps.append({**step, "epoch": epoch, **round_stats})
            bar.update(1)
            # optional early stop on the policy KL, as TRL (1.5 × target_kl)
            if params.early_stopping and step["policy_kl"] > 1.5 * params.target_kl:
                early_stop = True
                break
        if early_stop:
            break
    bar.close()
    # KL controller update with the batch's mean summed KL and n_steps = batch size
    kl_controller.update(round_stats["kl"], n)
    return steps


def _progress(total: int, enabled: bool):
    return tqdm(total=total, desc="ppo", disable=not enabled)


STEP_STATS = ("policy_loss", "value_loss", "approx_kl", "policy_kl", "clipfrac", "vf_clipfrac", "entropy",
              "ratio_mean")  # every one a token mean over the minibatch


def _optimizer_step(policy, optimizer, batch, tensors, indices, params: PPOParams, width, dp) -> dict:
    """Accumulate gradients over the minibatches of `indices`, clip, step; return the step's stats.

    Data parallel: each process runs the forward pass on its share of every minibatch. Its loss and stats (token
    means over its share) are weighted by its share of the minibatch's tokens and summed over the
    processes, which gives the token means over the whole minibatch, as one process computes
    them; so the ratio guard and the early stop decide the same in every process. Gradients are
    all-reduced by the prepared model in the step's last backward only (DDP), or reduce-scattered in
    every backward (FSDP2, ZeRO-2/3), or reduced in the DeepSpeed engine's step (ZeRO-1);
    DataParallel.skipped_forward finishes the sync after a skipped minibatch.
    """
    started = time.perf_counter()
    sums, skipped, applied, tokens = dict.fromkeys(STEP_STATS, 0.0), 0, 0, 0
    mini_batches = [indices[s : s + params.mini_batch_size] for s in range(0, len(indices), params.mini_batch_size)]
    if params.algorithm != "ppo":
        tensors["step_tokens"] = tensors["mask"][indices].sum().item()  # dapo's normaliser
    for k, mb in enumerate(mini_batches):
        last = k == len(mini_batches) - 1
        with dp.gradient_sync(policy, sync=last):
            loss, stats = _minibatch_loss(policy, batch, tensors, mb, params, width, dp)
            for key in STEP_STATS:
                sums[key] += stats[key]
            tokens += int(tensors["mask"][mb].sum().item())
            if ratio_exceeds(stats["ratio_mean"], params.ratio_threshold):
                skipped += 1  # TRL zeroed this loss with a warning; drlc skips it and counts it
                dp.skipped_forward(policy, last=last)
                continue
            dp.backward(policy, loss / params.gradient_accumulation_steps)
            applied += 1
    grad_norm = 0.0
    if applied:
        trainable = [p for p in policy.parameters() if p.requires_grad and p.grad is not None]
        max_norm = params.max_grad_norm if params.max_grad_norm is not None else float("inf")
        grad_norm = dp.clip_and_step(policy, optimizer, trainable, max_norm)
    optimizer.zero_grad(set_to_none=True)
    elapsed = time.perf_counter() - started
    step = {key: value / len(mini_batches) for key, value in sums.items()}
    step.update({"skipped": skipped, "grad_norm": grad_norm, "lr": optimizer.param_groups[0]["lr"],
                 "tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0})
    return step


def _minibatch_loss(policy, batch, tensors, mb, params: PPOParams, width, dp) -> tuple[torch.Tensor, dict]:
    """(loss to backward, STEP_STATS token means) of minibatch `mb`: this process's share of it.

    The stats are summed over the processes with token-share weights (the whole minibatch's
    means), and the loss is scaled by world_size · token share, so DDP's gradient average is the
    gradient of the whole minibatch's token mean. One process: its share is 1 and the sum is its
    own stats, so both are unchanged (x·1.0 is x exactly).
    """
    if params.algorithm != "ppo":
        return _value_free_minibatch_loss(policy, batch, tensors, mb, params, width, dp)
    rows = dp.shard(mb)
    forward = response_logprobs(
        policy, query_ids=[batch.query_ids[i] for i in rows], response_ids=[batch.response_ids[i] for i in rows],
        pad_id=PAD_ID, width=width, mixed_precision=params.mixed_precision, with_entropy=True,
    )
    logprobs, vpreds = forward.logprobs, forward.values  # (b, T) each, fp32
    mask = tensors["mask"][rows]  # (b, T)
    weights = tensors["is_weights"][rows] if "is_weights" in tensors else None  # (b, T) or None (no engine)
    pg_loss, pg_stats = policy_loss(logprobs=logprobs, old_logprobs=tensors["old_logprobs"][rows],
                                    advantages=tensors["advantages"][rows], mask=mask, cliprange=params.cliprange,
                                    is_weights=weights)
    vf_loss, vf_clipfrac = value_loss(vpreds=vpreds, old_values=tensors["old_values"][rows],
                                      returns=tensors["returns"][rows], mask=mask,
                                      cliprange_value=params.cliprange_value)
    entropy = masked_mean(forward.entropy, mask).item()
    stats = {**pg_stats, "policy_loss": pg_loss.item(), "value_loss": vf_loss.item(),
             "vf_clipfrac": vf_clipfrac, "entropy": entropy}
    loss = pg_loss + params.vf_coef * vf_loss
    share = mask.sum().item() / tensors["mask"][mb].sum().item()  # this process's share of the tokens
    summed = dp.all_reduce_sum(torch.tensor([stats[k] * share for k in STEP_STATS], dtype=torch.float64,
                                            device=mask.device))
    return loss * (share * dp.world_size), dict(zip(STEP_STATS, summed.tolist()))


def _value_free_minibatch_loss(policy, batch, tensors, mb, params: PPOParams, width, dp) -> tuple[torch.Tensor, dict]:
    """_minibatch_loss of a value-free algorithm: its loss (value_free_loss, already this process's share of the
    whole minibatch's, so only DDP's average is undone) and the same STEP_STATS (value_loss, vf_clipfrac 0;
    clipfrac, approx_kl, policy_kl, ratio_mean as PPO's, from the token advantages)."""
    rows = dp.shard(mb)
    forward = response_logprobs(
        policy, query_ids=[batch.query_ids[i] for i in rows], response_ids=[batch.response_ids[i] for i in rows],
        pad_id=PAD_ID, width=width, mixed_precision=params.mixed_precision, with_entropy=True,
    )
    mask, all_mask = tensors["mask"][rows], tensors["mask"][mb]  # (b, T), (mb, T)
    mine = {key: tensors[key][rows] for key in ("old_logprobs", "ref_logprobs", "advantages", "sequence_advantages",
                                                 "is_weights") if key in tensors}
    tokens = all_mask.sum().item()
    if params.algorithm == "grpo" and params.loss_type == "dapo":  # one token mean over the optimizer step,
        tokens = tensors["step_tokens"] / params.gradient_accumulation_steps  # once the caller divides by the steps
    loss = value_free_loss(params, logprobs=forward.logprobs, tensors=mine, mask=mask, kl_coef=tensors["kl_coef"],
                           rows=len(mb), tokens=tokens, max_completion_length=tensors["max_completion_length"])
    _, pg_stats = policy_loss(logprobs=forward.logprobs, old_logprobs=mine["old_logprobs"],
                              advantages=mine["advantages"], mask=mask, cliprange=params.cliprange)
    stats = {**pg_stats, "policy_loss": loss.item(), "value_loss": 0.0, "vf_clipfrac": 0.0,
             "entropy": masked_mean(forward.entropy, mask).item()}
    share = mask.sum().item() / all_mask.sum().item()  # token means are weighted by this process's token share,
    weights = [1.0 if key == "policy_loss" else share for key in STEP_STATS]  # the loss is already its share
    summed = dp.all_reduce_sum(torch.tensor([stats[k] * w for k, w in zip(STEP_STATS, weights)], dtype=torch.float64,
                                            device=mask.device))
    return loss * dp.world_size, dict(zip(STEP_STATS, summed.tolist()))


def save_trainer_state(directory: str | Path, optimizer, kl_controller, score_moments, *,
                       round_: int | None = None) -> None:
    """Write optimizer.pt and trainer_state.json: what the next round reads besides the weights.

    optimizer.pt holds Adam's moments and step count (its bias correction continues);
    trainer_state.json the KL controller's β, the score running moments and `round`, the round
    that wrote the checkpoint (the cursor a following round checks it starts after).
    No LR scheduler exists (constant lr, as TRL's default) and no RNG state is saved: every random
    draw of a round comes from generators seeded by (run seed, round), see
    pipeline.core.seeding.round_seed, so nothing random carries over from one round to the next.
    Each file is written to a temporary name and renamed; a whole checkpoint folder is atomic
    when written inside pipeline.core.atomic.atomic_folder (as the ppo stage does).
    optimizer: a torch optimizer, or an optimizer state dict already gathered to full tensors.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state_dict = optimizer if isinstance(optimizer, dict) else optimizer.state_dict()
    with atomic_file(directory / "optimizer.pt") as temp:
        torch.save(state_dict, temp)
    state = {"kl_controller": kl_controller.state_dict(), "score_moments": score_moments.state_dict(),
             "round": round_}
    write_text(directory / "trainer_state.json", json.dumps(state, indent=2, sort_keys=True))


def load_trainer_state(directory: str | Path, optimizer, kl_controller, score_moments) -> int | None:
    """Restore what save_trainer_state wrote, in place; return the round that wrote it (or None).

    The optimizer keeps its own learning rate (make_optimizer's, this round's ppo.learning_rate)
    and Adam kernel: optimizer.pt's param_groups hold the writing round's, which load_state_dict
    would otherwise restore, so a changed ppo.learning_rate would never train.
    Raises DataError if a file is missing.
    """
    directory = Path(directory)
    for name in ("optimizer.pt", "trainer_state.json"):
        if not (directory / name).is_file():
            raise DataError(f"Trainer state '{directory / name}' is missing: resume from a complete round.")
    kernels = {key: optimizer.defaults[key] for key in ("fused", "foreach") if key in optimizer.defaults}
    rates = [group["lr"] for group in optimizer.param_groups]
    optimizer.load_state_dict(torch.load(directory / "optimizer.pt", map_location="cpu", weights_only=True))
    for group, lr in zip(optimizer.param_groups, rates, strict=True):  # this round's choices, not the checkpoint's
        group.update(kernels, lr=lr)
    state = json.loads((directory / "trainer_state.json").read_text())
    kl_controller.load_state_dict(state["kl_controller"])
    score_moments.load_state_dict(state["score_moments"])
    return state.get("round")
