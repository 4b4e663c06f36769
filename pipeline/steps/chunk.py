"""`chunk` stage: K consecutive PPO rounds in one process (run.rounds_per_stage = K > 1).

Design. A per-round run is four DVC stages a round, each a fresh process that loads its models
from disk and writes a full checkpoint. A chunk runs the same four steps for rounds
``chunk``..``chunks.<chunk>.last`` with everything loaded once: the policy, value head,
reference, Adam, KL controller and score moments (a ``PPOState``, pipeline/steps/ppo_round.py),
the environment reward, and the critic (template, tokenizer, cache and, for endpoint 'local',
its server: one ``critic_session`` per chunk). The checkpoint is written once, at the end.

There is one way to run a round: this module calls the very step functions the per-round
stages call (``rollout_with``, ``score_round``, ``CriticSession.critique``, ``join_round`` +
``train_ppo_round``), and nothing else. Equal outputs follow from three facts:
- every random draw of a round comes from generators seeded by (run seed, round)
  (pipeline/core/seeding.py), and the global torch seed is set per round exactly where the
  per-round stages set it;
- the carried PPOState is the state a checkpoint holds, so keeping it in memory is what
  save -> load gives (fresh LoRA adapters are added once, seeded by the chunk's first round,
  as the ppo stage does for a round that starts from base);
- each table is written and read back before the next step uses it, so every step sees the
  values the Parquet types hold (float32 log-probs), as a per-round stage reading its inputs does.
So rounds 1..N give the same tables whatever K is (tests/test_chunked_rounds.py checks it).

Every round still writes its own partitions and metrics, one folder deeper than per-round
stages (the chunk stage's DVC outputs): ``<data>/<table>/chunk=KKKK/round=NNNN/part-0.parquet``
and ``<metrics>/<rollout|score|critique|ppo>/chunk=KKKK/round=NNNN.json``; readers use pipeline/core/store.py's
helpers for both layouts. A chunk stage that fails or is killed writes no checkpoint, and DVC
re-runs the whole chunk (its outputs are one unit), from the previous chunk's checkpoint.
One process only: under `accelerate launch` use per-round stages (rounds_per_stage: 1).

With ``rollout.engine: vllm`` the chunk starts one vLLM engine (pipeline/model/vllm_engine.py) and, after each
round's PPO, hands it the new policy in place: the LM's weights (full fine-tuning), or the round's adapters saved
to a folder and served as a new LoRA request (LoRA policies; the base stays loaded). Round k+1 is thus sampled
from the weights round k trained, as per-round stages sample from round k's checkpoint. Between its rollout and
that update the engine sleeps where vLLM can (GPU: its weights in host memory, its KV cache freed), so scoring,
a local critic and PPO get the memory; on CPU it stays as it is.
"""
from __future__ import annotations

import os
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import torch

from pipeline.core import store
from pipeline.core.config import CriticParams, Params
from pipeline.core.device import place
from pipeline.core.errors import ConfigError
from pipeline.core.seeding import round_seed
from pipeline.model.vllm_engine import VLLMEngine
from pipeline.steps.critique import critic_session
from pipeline.steps.ppo_round import (
    group_size,
    join_round,
    kl_reward_rows,
    load_ppo_state,
    response_limit,
    save_ppo_state,
    step_row,
    summarize,
    train_ppo_round,
)
from pipeline.steps.rollout import rollout_with
from pipeline.steps.score import score_round
from pipeline.steps.stage import write_json
from pipeline.tasks import get_task


def chunk_outputs(data_dir: str | Path, metrics_dir: str | Path, chunk: str) -> dict[str, Path]:
    """{table or metrics kind: the chunk's output folder}, e.g. rollouts -> data/rollouts/chunk=0001."""
    folders = {t: store.chunk_dir(data_dir, t, chunk) for t in ("rollouts", "scores", "annotations", "ppo_steps",
                                                                        "kl_rewards")}
    folders |= {f"{kind}_metrics": Path(metrics_dir) / kind / f"chunk={chunk}"
                for kind in ("rollout", "score", "critique", "ppo")}
    return folders


def update_engine(engine: VLLMEngine, policy, adapter_dir: Path) -> None:
    """Make `engine` sample from `policy` (PolicyWithValueHead) from now on: a LoRA policy's adapters are saved to
    adapter_dir and served as a new LoRA request; a full model's LM weights are loaded in place."""
    if engine.lora:
        policy.lm.save_pretrained(adapter_dir)
        engine.use_adapter(adapter_dir)
    else:
        engine.load_weights(policy.lm.state_dict().items())


def _stored(rows: list[dict], table: str, folder: Path) -> list[dict]:
    """Write rows as the table's partition in `folder` and return them as read back (the Parquet types)."""
    store.write_table(rows, table, folder)
    return store.read_table(folder, table)


def run_chunk(prompt_rows: list[dict], *, params: Params, chunk: str, policy_dir: str, reference_dir: str,
              out_dir: str, data_dir: str | Path, metrics_dir: str | Path, device="cpu", log=print) -> list[dict]:
    """Run the rounds of `chunk` (params.chunks) and write every round's tables and metrics, then
    the last round's checkpoint to out_dir. See the module docstring.

    prompt_rows: the prompts table; policy_dir: the checkpoint the chunk starts from (its `prev`);
    reference_dir: models/base (reference model, critic tokenizer); device: run.device resolved
    (policy, reference, reward model and a local hf critic run there). Returns each round's critique metrics.
    Raises ConfigError under a multi-process launch or for an unknown chunk; CriticError as the
    critique stage (the chunk then stops, and writes no checkpoint).
    """
    if chunk not in params.chunks:
        raise ConfigError(f"--chunk {chunk!r} is not in params 'chunks': {sorted(params.chunks)}.")
    return run_rounds(prompt_rows, params=params, keys=params.chunk_rounds(chunk), critic=params.critic,
                      name=f"chunk {chunk}", policy_dir=policy_dir, reference_dir=reference_dir, out_dir=out_dir,
                      folders=chunk_outputs(data_dir, metrics_dir, chunk), device=device, log=log)


def run_rounds(prompt_rows: list[dict], *, params: Params, keys: list[str], critic: CriticParams, name: str,
               policy_dir: str, reference_dir: str, out_dir: str, folders: dict[str, Path], device="cpu",
               log=print) -> list[dict]:
    """Rounds `keys` (consecutive, starting from policy_dir) in this process, critiqued by `critic`;
    every round's tables and metrics into `folders` (:func:`chunk_outputs`), the last checkpoint to out_dir.

    The engine of a chunk stage and of the two sides of a switch-over (pipeline/steps/switch.py).
    name: how the log lines call the block. Returns each round's critique metrics.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("The chunk stage runs in one process: for `accelerate launch` set run.rounds_per_stage: 1 "
                          "(`drlc rounds N`), whose ppo stages run data parallel.")
    run, r = params.run, params.rollout
    reward = place(get_task(run.task).make_reward(params.score), device)
    torch.manual_seed(round_seed(run.seed, int(keys[0]), 3))  # as the ppo stage before it loads its models
    state = load_ppo_state(policy_dir, reference_dir=reference_dir, params=params.ppo, seed=run.seed,
                           round_=int(keys[0]), base=params.base, device=device)
    summaries = []
    with ExitStack() as open_now:
        session = open_now.enter_context(critic_session(critic, tokenizer_dir=reference_dir, task=run.task,
                                                        device=device))
        engine = None if r.engine == "hf" else open_now.enter_context(VLLMEngine.for_rollout(
            policy_dir, r, lora_rank=params.base.lora_r, seed=run.seed, mixed_precision=params.ppo.mixed_precision))
        adapters = open_now.enter_context(tempfile.TemporaryDirectory(prefix="drlc-adapters-")) if engine else None
        engine_times = {"engine_start_s": engine.start_s if engine else 0.0}
        for key in keys:
            round_, part = int(key), f"round={key}"
            rollouts, rollout_metrics = rollout_with(
                engine or state.policy, state.tokenizer, prompt_rows, policy_name=params.rounds[key].prev,
                run_id=run.run_id,
                round_=round_, seed=run.seed, batch_size=r.batch_size, max_new_tokens=r.max_new_tokens,
                generation_batch_size=r.generation_batch_size, min_new_tokens=r.min_new_tokens,
                samples_per_prompt=r.samples_per_prompt)
            if engine is not None:  # asleep while scoring, the critic and PPO run (where vLLM can sleep)
                engine.sleep()
                rollout_metrics.update(engine.describe(), **engine_times)
            rollouts = _stored(rollouts, "rollouts", folders["rollouts"] / part)
            write_json(rollout_metrics, folders["rollout_metrics"] / f"{part}.json")
            scores, score_metrics = score_round(rollouts, prompt_rows, task=run.task, run_id=run.run_id,
                                                round_=round_, params=params.score, reward=reward)
            scores = _stored(scores, "scores", folders["scores"] / part)
            write_json(score_metrics, folders["score_metrics"] / f"{part}.json")
            annotations, critique_metrics = session.critique(rollouts, scores, run_id=run.run_id, round_=round_,
                                                             prompt_rows=prompt_rows)
            annotations = _stored(annotations, "annotations", folders["annotations"] / part)
            write_json(critique_metrics, folders["critique_metrics"] / f"{part}.json")
            torch.manual_seed(round_seed(run.seed, round_, 3))  # as the ppo stage
            per_token = []
            stats = train_ppo_round(state, join_round(rollouts, scores, annotations), params=params.ppo,
                                    seed=run.seed, round_=round_, group_size=group_size(rollouts),
                                    max_completion_length=response_limit(rollouts), kl_rewards=per_token)
            steps = [step_row(stat, run_id=run.run_id, round_=round_, step=i) for i, stat in enumerate(stats)]
            store.write_table(steps, "ppo_steps", folders["ppo_steps"] / part)
            store.write_table(kl_reward_rows(rollouts, per_token, params=params.ppo, stats=stats, run_id=run.run_id,
                                             round_=round_), "kl_rewards", folders["kl_rewards"] / part)
            write_json({**summarize(steps), "device": str(device)}, folders["ppo_metrics"] / f"{part}.json")
            if engine is not None and key != keys[-1]:  # the next round samples from this round's policy
                started = time.perf_counter()
                engine.wake_up()
                update_engine(engine, state.policy, Path(adapters) / part)
                engine_times = {"engine_start_s": 0.0, "engine_update_s": time.perf_counter() - started}
            log(f"{name}: round {key}: {critique_metrics['critiqued']} critiqued, "
                f"{critique_metrics['critic_requests']} requests, {len(steps)} PPO steps")
            summaries.append(critique_metrics)
    save_ppo_state(state, out_dir, round_=int(keys[-1]))
    return summaries
