"""`ppo` stage: one round of PPO epochs over the round's rollouts, env rewards and intrinsic (critic) rewards."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline.core.atomic import atomic_folder
from pipeline.core.config import BaseParams, PPOParams
from pipeline.core.errors import ConfigError, DataError
from pipeline.core.seeding import round_seed
from pipeline.model.lora import add_adapters, has_adapters
from pipeline.model.policy import PolicyWithValueHead, load_policy, write_policy_files
from pipeline.model.reference import make_reference
from pipeline.parallel.distributed import DataParallel
from pipeline.parallel.single import SingleProcess
from pipeline.train.ppo import AdaptiveKLController, FixedKLController, RunningMoments
from pipeline.train.trainer import RolloutBatch, load_trainer_state, make_optimizer, save_trainer_state, train_round


def join_round(rollouts: list[dict], scores: list[dict], annotations: list[dict]) -> RolloutBatch:
    """Line up the round's three tables by rollout_id into one PPO batch; its env rewards are the shaped ones
    (scores.env_reward_shaped: score.scale and score.normalize applied, pipeline/rewards/shaping.py)."""
    if scores and "env_reward_shaped" not in scores[0]:
        raise DataError("The scores table has no 'env_reward_shaped' column (written by a drlc before reward "
                        "shaping moved to one place): re-run the score stage of this round and those after "
                        "it (dvc repro; cached critic answers cost nothing).")
    env_rewards = {row["rollout_id"]: row["env_reward_shaped"] for row in scores}
    intrinsic_rewards = {row["rollout_id"]: row["token_rewards"] for row in annotations}  # the critic's, per token
    missing = [r["rollout_id"] for r in rollouts
               if r["rollout_id"] not in env_rewards or r["rollout_id"] not in intrinsic_rewards]
    if missing:
        raise DataError(f"Rollouts {missing[:3]} have no score or annotation row: re-run the score "
                        f"and critique stages of this round (dvc repro).")
    return RolloutBatch(
        query_ids=[r["query_ids"] for r in rollouts], response_ids=[r["response_ids"] for r in rollouts],
        behaviour_logprobs=[r["behaviour_logprobs"] for r in rollouts],
        env_rewards=[env_rewards[r["rollout_id"]] for r in rollouts],
        intrinsic_rewards=[intrinsic_rewards[r["rollout_id"]] for r in rollouts],
        engine_logprobs=([r["engine_logprobs"] for r in rollouts]
                         if rollouts and "engine_logprobs" in rollouts[0] else None),
    )


def group_size(rollouts: list[dict]) -> int:
    """Responses per prompt of a round's rollouts: 1 + the largest sample_index (1 for a table without groups)."""
    return 1 + max((r.get("sample_index") or 0 for r in rollouts), default=0)


def response_limit(rollouts: list[dict]) -> int | None:
    """The round's largest per-response token limit (the rollout's max_new_tokens): dr_grpo's normaliser.

    None for rows without the column (hand-made batches): train_round then uses the batch width.
    """
    limits = [r["max_new_tokens"] for r in rollouts if "max_new_tokens" in r]
    return max(limits) if limits else None


def new_kl_controller(params: PPOParams):
    if params.adap_kl_ctrl:
        return AdaptiveKLController(params.init_kl_coef, params.target, params.horizon)
    return FixedKLController(params.init_kl_coef)


@dataclass
class PPOState:
    """Everything one round of PPO hands the next: what a checkpoint holds, plus the reference model.

    policy (LM + value head), tokenizer, reference (pipeline/model/reference.py), optimizer (Adam),
    kl_controller, score_moments. Written by :func:`save_ppo_state`, read back by :func:`load_ppo_state`;
    the chunk stage (pipeline/steps/chunk.py) keeps it in memory from one round to the next instead.
    """

    policy: PolicyWithValueHead
    tokenizer: object
    reference: torch.nn.Module
    optimizer: torch.optim.Optimizer | dict  # a gathered state dict after a data-parallel round
    kl_controller: object
    score_moments: RunningMoments


def ppo_round(rollouts: list[dict], scores: list[dict], annotations: list[dict], *, policy_dir: str,
              reference_dir: str, out_dir: str, params: PPOParams, run_id: str, round_: int,
              seed: int, base: BaseParams | None = None, device="cpu",
              kl_rewards: list | None = None) -> list[dict]:
    """Train the policy of `policy_dir` for one round and save the checkpoint to out_dir.

    The reference model is the base model: a frozen copy, or with lower layers shared
    (params.num_shared_layers), or the policy with its LoRA adapters disabled when `base.lora_r`
    > 0 (a round starting from the base model then adds fresh adapters; see pipeline/model/reference.py).
    Optimizer, KL controller and score moments
    carry over from the previous round's checkpoint when it has them; the checkpoint written
    (policy, value head, optimizer.pt, trainer_state.json) is everything the next round reads.
    Launched with N processes (pipeline.parallel.distributed), the round runs data parallel and only the
    main process writes the checkpoint; every process returns the same rows.
    A single process trains on `device` (run.device); N processes on accelerator.device.
    Returns the `ppo_steps` rows, one per gradient step; a `kl_rewards` list receives the round's
    `kl_rewards` rows (kl_reward_rows), one per response.
    Raises ConfigError if policy_dir holds the checkpoint of this round or a later one.
    """
    batch = join_round(rollouts, scores, annotations)
    per_token = [] if kl_rewards is not None else None
    processes = DataParallel.from_environment() or SingleProcess()
    torch.manual_seed(round_seed(seed, round_, 3))
    state = load_ppo_state(policy_dir, reference_dir=reference_dir, params=params, seed=seed, round_=round_, base=base,
                           device=device if processes.world_size == 1 else "cpu")  # accelerate places its own
    stats = train_ppo_round(state, batch, params=params, seed=seed, round_=round_, data_parallel=processes,
                            group_size=group_size(rollouts), max_completion_length=response_limit(rollouts),
                            kl_rewards=per_token)
    if kl_rewards is not None:
        kl_rewards.extend(kl_reward_rows(rollouts, per_token, params=params, stats=stats, run_id=run_id, round_=round_))
    if processes.is_main:
        save_ppo_state(state, out_dir, round_=round_)
    processes.close()  # after the checkpoint is written: no rank exits before it exists
    return [step_row(stat, run_id=run_id, round_=round_, step=i) for i, stat in enumerate(stats)]


def load_ppo_state(policy_dir: str, *, reference_dir: str, params: PPOParams, seed: int, round_: int,
                   base: BaseParams | None = None, device="cpu") -> PPOState:
    """The PPOState round_ starts from: the policy of policy_dir (fresh LoRA adapters, seeded by round_,
    when base.lora_r > 0 and it has none), its reference, and the optimizer, KL controller and score
    moments of policy_dir's trainer state when it has one (fresh ones from base); policy and
    reference on `device`.

    Raises ConfigError if policy_dir holds the checkpoint of round_ or a later one.
    """
    policy, tokenizer = load_policy(policy_dir, seed=seed, value_head=params.algorithm == "ppo")
    if base is not None and base.lora_r > 0 and not has_adapters(policy.lm):
        policy.lm = add_adapters(policy.lm, r=base.lora_r, alpha=base.lora_alpha, base_dir=reference_dir,
                                 target_modules=base.lora_target_modules, seed=round_seed(seed, round_, 5))
    reference = make_reference(policy, reference_dir, params.num_shared_layers)
    policy, reference = policy.to(device), reference.to(device)  # before the optimizer: its state loads there
    optimizer = make_optimizer(policy, params.learning_rate)
    kl_controller, moments = new_kl_controller(params), RunningMoments()
    if (Path(policy_dir) / "trainer_state.json").is_file():
        previous = load_trainer_state(policy_dir, optimizer=optimizer, kl_controller=kl_controller,
                                      score_moments=moments)
        if previous is not None and previous >= round_:
            raise ConfigError(f"--policy {policy_dir} holds the checkpoint of round {previous}, but this is "
                              f"round {round_}: a round starts from an earlier round (check `prev` in 'rounds').")
    return PPOState(policy, tokenizer, reference, optimizer, kl_controller, moments)


def train_ppo_round(state: PPOState, batch: RolloutBatch, *, params: PPOParams, seed: int, round_: int,
                    data_parallel: DataParallel | SingleProcess | None = None, group_size: int = 1,
                    max_completion_length: int | None = None, kl_rewards: list | None = None) -> list[dict]:
    """One round of PPO epochs on `batch` (train_round); updates `state` in place, returns the stats dicts.
    kl_rewards: a list to receive each response's per-token KL reward (train_round's).

    data_parallel: None or a SingleProcess for one process, whose state keeps its policy and optimizer.
    Data parallel, state.policy becomes the full gathered module and state.optimizer the full Adam
    state dict (on the main process; what save_ppo_state writes), the same for any process count.
    """
    dp = SingleProcess() if data_parallel is None else data_parallel
    # prepared after the trainer state is loaded into the plain optimizer (one process: as they are)
    model, optimizer, reference = dp.prepare(state.policy, state.optimizer, state.reference,
                                             max_grad_norm=params.max_grad_norm, mini_batch_size=params.mini_batch_size)
    stats = train_round(
        policy=model, ref_model=reference, optimizer=optimizer, batch=batch, params=params,
        kl_controller=state.kl_controller, score_moments=state.score_moments, seed=round_seed(seed, round_, 4),
        progress=dp.is_main, data_parallel=dp, group_size=group_size, max_completion_length=max_completion_length,
        kl_rewards=kl_rewards,
    )
    state.policy, state.optimizer = dp.full_state(model, optimizer)  # every rank gathers; DDP, FSDP2 or ZeRO alike
    return stats


def save_ppo_state(state: PPOState, out_dir: str, *, round_: int) -> None:
    """Write the checkpoint of round_ to out_dir atomically: weights and trainer state appear together or not at all."""
    with atomic_folder(out_dir) as folder:
        write_policy_files(state.policy, state.tokenizer, folder)
        save_trainer_state(folder, optimizer=state.optimizer, kl_controller=state.kl_controller,
                           score_moments=state.score_moments, round_=round_)


def step_row(stat: dict, *, run_id: str, round_: int, step: int) -> dict:
    """One `ppo_steps` row from one train_round stats dict: the same names (docs/metrics.md)."""
    row = {key: float(value) for key, value in stat.items()}
    row.update(skipped=bool(stat["skipped"]), epoch=int(stat["epoch"]))
    return {"run_id": run_id, "round": round_, "step": step, **row}


def kl_reward_rows(rollouts: list[dict], per_token: list, *, params: PPOParams, stats: list[dict], run_id: str,
                   round_: int) -> list[dict]:
    """The round's `kl_rewards` rows: per response, the KL part of each token's reward (ppo.token_kl_rewards),
    with the algorithm, the KL estimator (ppo.kl_penalty) and the round's kl_coef β it was computed with."""
    kl_coef = stats[0]["kl_coef"] if stats else None
    return [{"run_id": run_id, "round": round_, "rollout_id": r["rollout_id"], "algorithm": params.algorithm,
             "kl_penalty": params.kl_penalty, "kl_coef": kl_coef, "kl_reward": values}
            for r, values in zip(rollouts, per_token, strict=True)]


# rounds on an external engine's rollouts: the gap, and the truncated importance-sampling weights (ppo.engine_is_cap)
ENGINE_GAPS = ("engine_logprob_gap_max", "engine_logprob_gap_mean", "is_capped_share", "is_weight_mean")
SUMMARY_MEANS = ("policy_loss", "value_loss", "approx_kl", "policy_kl", "clipfrac", "entropy", "kl", "kl_coef")


def summarize(steps: list[dict]) -> dict:
    """metrics/ppo/round=*.json: the mean of each SUMMARY_MEANS column over the applied steps, steps, skipped_steps,
    and for a round on an external engine's rollouts its ENGINE_GAPS (one value per round)."""
    used = [s for s in steps if not s["skipped"]] or steps
    summary = {k: sum(s[k] for s in used) / len(used) for k in SUMMARY_MEANS}
    summary.update({k: steps[0][k] for k in ENGINE_GAPS if steps and k in steps[0]})  # one value per round
    summary["steps"] = len(steps)
    summary["skipped_steps"] = sum(s["skipped"] for s in steps)
    return summary
