"""`drlc estimate`'s run time: the seconds of each per-round stage at a device's Throughput.

Per round (run.rounds_per_stage 1), with P policy parameters, L layers, B = rollout.batch_size,
G = generation_batch_size, q query and r mean response tokens, n = max_new_tokens, E = ppo_epochs,
M = mini_batch_size (pipeline/model/throughput.py has the per-call formulas):

- rollout: ceil(B / G) batches, each a prefill forward of G x q tokens and n decoding steps of G
  sequences at the mean context q + n / 2; with rollout.engine vllm, G = vLLM's max_num_seqs (256 unless
  rollout.vllm_args sets it: continuous batching takes every request at once), decoding steps split over
  tensor_parallel_size devices, plus the engine's start (VLLM_START_S) once per rollout stage: each round
  with per-round stages, once per chunk of run.rounds_per_stage rounds;
- score: a local scorer model's forward over B x (q + r) tokens (VADER and other lexicons: none);
  calibrated, also the time the task's make_reward takes to build a scorer that reads no model
  (e.g. the fitted toxicity scorer learning score.train_data);
- critique: critic calls x critic latency / critic.max_concurrency (a local lexicon or offline
  backend: none), as configured;
- ppo: the policy's and the reference's no-grad forwards, then E x B / M training steps of M x (q + r)
  tokens (Adam's update is not counted);
- every stage: its process start and DVC's per-stage work, and the model folders it loads (the
  load-time section's folders and bytes of a round from round 2: load_call_s each + bytes / load_bps);
  ppo also writes its checkpoint (bytes / write_bps).
The base and evaluate stages (once per run) are not counted. With run.rounds_per_stage > 1 the loads
and writes are counted once for the run (at --disk-gbps) instead.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from pipeline.core.config import Params
from pipeline.model.throughput import (
    Throughput,
    assumed,
    decode_step_s,
    forward_s,
    kv_bytes,
    load_s,
    train_step_s,
    write_s,
)

ROUND_STAGES = ("rollout", "score", "critique", "ppo")


@dataclass(frozen=True)
class PolicyShape:
    """What the time formulas need of the policy (and of a local scorer model)."""

    params: int
    layers: int
    hidden: int
    dtype_bytes: int
    trainable: int | None = None  # weights that get gradients (LoRA: the adapters and value head); None = all
    scorer_params: int = 0
    scorer_layers: int = 0


@dataclass(frozen=True)
class RunTime:
    """Seconds of each per-round stage and of the whole run's rounds."""

    rounds: int
    stages: dict = field(default_factory=dict)  # {stage: seconds per round}
    io_s: float = 0.0  # model loads and checkpoint writes of the whole run
    throughput: Throughput | None = None

    @property
    def round_s(self) -> float:
        return sum(self.stages.values())

    @property
    def run_s(self) -> float:
        return self.rounds * self.round_s + self.io_s


# vLLM's start-up (model load, KV cache, compiled graphs) per engine: measured on this 2-core CPU for SmolLM2-135M
# (benchmarks/results/vllm_rollouts.json: ~70 s compiled, ~20 s with enforce_eager); on CUDA an assumption
VLLM_START_S = {"cpu": 70.0, "cpu_eager": 20.0, "cuda": 60.0, "cuda_eager": 30.0}


def rollout_s(params: Params, shape: PolicyShape, t: Throughput, query: float) -> float:
    """Compute seconds of the rollout stage: prefill and memory-bound decoding of every generation batch
    (rollout.engine vllm: vLLM's batches over its tensor-parallel devices, and its start shared by the chunk)."""
    r = params.rollout
    vllm, devices, start = r.engine == "vllm", 1, 0.0
    batch = min(r.generation_batch_size, r.batch_size)
    if vllm:
        batch = min(int(r.vllm_args.get("max_num_seqs") or 256), r.batch_size)
        devices = int(r.vllm_args.get("tensor_parallel_size") or 1)
        start = VLLM_START_S[t.kind + ("_eager" if r.vllm_args.get("enforce_eager") else "")]
        start /= params.run.rounds_per_stage
    batches = math.ceil(r.batch_size / batch)
    weights = shape.params * shape.dtype_bytes
    kv = kv_bytes(shape.layers, shape.hidden, query + r.max_new_tokens / 2, batch, shape.dtype_bytes)
    step = decode_step_s(t, shape.params // devices, weights / devices, kv / devices, batch, shape.layers)
    prefill = forward_s(t, shape.params, batch * query, shape.layers) / devices
    return start + batches * (prefill + r.max_new_tokens * step)


def ppo_s(params: Params, shape: PolicyShape, t: Throughput, tokens_per_response: float) -> float:
    """Compute seconds of the ppo stage: policy and reference forwards, then ppo_epochs x B / M steps."""
    p, batch = params.ppo, params.rollout.batch_size
    mb_tokens = p.mini_batch_size * tokens_per_response
    steps = math.ceil(batch / p.mini_batch_size)
    no_grad = 2 * steps * forward_s(t, shape.params, mb_tokens, shape.layers)
    return no_grad + p.ppo_epochs * steps * train_step_s(t, shape.params, mb_tokens, shape.layers, shape.trainable)


def estimate_run_time(params: Params, shape: PolicyShape, t: Throughput, *, query: float, response: float,
                      critic_calls: float, critic_latency_s: float, io_s: float = 0.0, loads: dict | None = None,
                      checkpoint_bytes: float = 0.0, scorer_setup_s: float = 0.0) -> RunTime:
    """RunTime of the training rounds; see the module docstring.

    loads: {stage: {folder: bytes}} each stage process loads in a round; checkpoint_bytes: what ppo writes;
    scorer_setup_s: the score stage's building of its reward (measured_scorer_setup_s).
    """
    tokens = query + response
    scorer = (forward_s(t, shape.scorer_params, params.rollout.batch_size * tokens, shape.scorer_layers)
              if shape.scorer_params else 0.0)
    work = {"rollout": rollout_s(params, shape, t, query),
            "score": scorer + scorer_setup_s,
            "critique": critic_calls * critic_latency_s / params.critic.max_concurrency,
            "ppo": ppo_s(params, shape, t, tokens) + write_s(t, checkpoint_bytes)}
    stages = {stage: t.start_s(stage) + _loads_s(t, (loads or {}).get(stage, {})) + seconds
              for stage, seconds in work.items()}
    return RunTime(rounds=len(params.rounds), stages=stages, io_s=io_s, throughput=t)


def _loads_s(t: Throughput, folders: dict) -> float:
    """A stage's loads: each model folder's fixed cost and bytes; a tokenizer alone (named "... (tokenizer)" in
    the load plan, pipeline/commands/estimate.py process_loads) counts its bytes only."""
    models = [name for name in folders if not name.endswith("(tokenizer)")]
    return load_s(t, len(models), sum(folders.values()))


def device_kind(params: Params) -> str:
    """'cuda' or 'cpu': run.device, with auto = CUDA when this machine has it."""
    setting = params.run.device
    if setting == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if setting.startswith("cuda") else "cpu"


def stated_throughput(params: Params) -> Throughput:
    return assumed(device_kind(params))


def runtime_section(run: RunTime) -> list[str]:
    """The `== run time ==` lines of the report: the figure with its assumptions beside it."""
    t = run.throughput
    per_stage = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in run.stages.items())
    return ["", "== run time (training rounds; base and evaluate not counted) ==",
            f"  ~{run.run_s / 60:.1f} min = {run.rounds} rounds x {run.round_s:.1f} s + loads/writes {run.io_s:.0f} s",
            f"  per round: {per_stage}",
            f"  assumptions: {t.describe()}",
            "  (measured calls extrapolated to the full depth and batch)" if t.measured else
            ("  (token generation memory-bound: weights + KV cache read once per decoding step; training at the MFU;"
             " the critic's latency and max_concurrency as configured)")]


def _layers_hidden(config) -> tuple[int, int]:
    layers = getattr(config, "n_layer", None) or getattr(config, "num_hidden_layers", 0)
    return layers, getattr(config, "n_embd", None) or getattr(config, "hidden_size", 0)


def layers_hidden(config) -> tuple[int, int]:
    """(layers, hidden size) of a transformers config (GPT-2's or Llama's field names)."""
    return _layers_hidden(config)


def stage_imports() -> dict[str, str]:
    """{stage: python code importing every module its stage script can import} (pipeline/core/code_deps.py)."""
    from pipeline.core.code_deps import import_closure

    def modules(stage: str) -> list[str]:
        files = import_closure(f"stages/{stage}.py")
        return sorted({f.removesuffix(".py").removesuffix("/__init__").replace("/", ".") for f in files})

    return {stage: "import " + ", ".join(modules(stage)) for stage in ROUND_STAGES}


def calibrated_throughput(params: Params, config, query: float, response: float, root=".") -> Throughput:
    """Throughput measured at `config`'s shape (the policy's) on run.device (pipeline/model/throughput.py)."""
    from pipeline.core.device import resolve_device
    from pipeline.core.errors import ConfigError
    from pipeline.model.throughput import calibrate

    if config is None:
        raise ConfigError(f"--calibrate: the shape of base.model = {params.base.model!r} is unknown offline; "
                          "give a local model folder or a model in pipeline/model/shapes.py KNOWN_MODELS.")
    seq = max(1, round(query + response))
    train_batch = max(1, min(params.ppo.mini_batch_size, 1024 // seq))
    decode_batch = max(1, min(params.rollout.generation_batch_size, params.rollout.batch_size, 64))
    return calibrate(config, resolve_device(params.run.device), train_batch=train_batch, seq=seq,
                     decode_batch=decode_batch, context=max(1, round(query + params.rollout.max_new_tokens / 2)),
                     stage_imports=stage_imports(), root=root)


def run_time(params: Params, shape: PolicyShape, *, config, query: float, response: float,
             critic_calls_per_round: float, critic_latency_s: float, io_s: float, calibrate: bool = False,
             loads: dict | None = None, checkpoint_bytes: float = 0.0, root=".") -> RunTime:
    """The run's RunTime at the stated Throughput of run.device's kind, or measured at `config` with `calibrate`."""
    t = calibrated_throughput(params, config, query, response, root) if calibrate else stated_throughput(params)
    return estimate_run_time(params, shape, t, query=query, response=response, critic_calls=critic_calls_per_round,
                             critic_latency_s=critic_latency_s, io_s=io_s, loads=loads,
                             checkpoint_bytes=checkpoint_bytes,
                             scorer_setup_s=measured_scorer_setup_s(params) if calibrate else 0.0)


def measured_scorer_setup_s(params: Params) -> float:
    """Seconds the task's own make_reward takes to build the environment reward (the fitted toxicity scorer
    learns score.train_data there); 0 for a scorer that reads a model (counted with the loads) or calls the
    network (perspective), which are not built offline."""
    import time

    from pipeline.tasks import get_task

    task = get_task(params.run.task)
    if params.score.scorer in task.MODEL_SCORERS or params.score.scorer == "perspective":
        return 0.0
    start = time.perf_counter()
    task.make_reward(params.score)
    return time.perf_counter() - start


def timed_critic_calls(params: Params, calls_per_round: float) -> float:
    """Critic calls that take time: a remote endpoint or the local hf backend (lexicon/offline answer at once)."""
    timed = params.critic.enabled and (params.critic.endpoint != "local" or params.critic.backend == "hf")
    return calls_per_round if timed else 0.0
