"""How fast a device generates tokens and trains: stated assumptions per device kind, or measured (calibrate).

The run-time estimate of `drlc estimate` (pipeline/commands/runtime.py) prices every stage with one
`Throughput`. Formulas (docs/estimate.md, each unit-tested against a hand computation):

- a forward over T tokens: 2 x params x T FLOPs at flops x mfu, plus layers x call_overhead_s;
- training a minibatch: the same with 6 x params x T (forward + two backward matmuls);
- one decoding step of a batch: memory-bound, max((weight bytes + KV bytes) / memory_bandwidth,
  2 x params x batch / (flops x mfu)) + layers x call_overhead_s; KV bytes = 2 x layers x hidden x
  context x batch x dtype bytes;
- a stage process: process_start_s (Python, torch and transformers imported) + dvc_stage_s
  (`dvc repro -s`'s own work: reading dvc.yaml, hashing deps and outs).

`calibrate` measures the same quantities on the local device in seconds: it builds the model
shape with 1 and 2 layers (random weights), times a few training steps and decoding steps of each
and extrapolates to the full depth (time = base + layers x per-layer), and times the imports of a
stage process (the stage modules' imports) and `dvc stage list` (reads dvc.yaml and params) in fresh
interpreters.
"""
from __future__ import annotations

import copy
import subprocess
import sys
import time
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Throughput:
    """A device's speed as the estimate uses it; `source` says whether stated or measured."""

    kind: str  # cpu or cuda
    flops: float  # peak FLOP/s of the dtype the model runs in
    mfu: float  # share of `flops` reached by forwards and training steps
    memory_bandwidth: float  # bytes/s a decoding step reads weights and KV cache at
    call_overhead_s: float  # per layer per forward call (kernel launches, Python): dominates tiny models
    process_start_s: float  # a stage process's interpreter and imports
    dvc_stage_s: float  # `dvc repro -s`'s own work per stage
    source: str
    # calibrated: measured seconds per call, {"train"|"decode": (base_s, per_layer_s)}, else empty
    measured: dict | None = None

    def describe(self) -> str:
        if self.measured:
            return (f"{self.kind}, MEASURED on this machine (--calibrate): " + ", ".join(
                f"{name} {self.measured[name][0] * 1e3:.2f} ms + {self.measured[name][1] * 1e3:.2f} ms/layer"
                for name in ("forward", "train", "decode"))
                + f"; stage process start {self.process_start_s:.1f} s, dvc per stage {self.dvc_stage_s:.1f} s")
        return (f"{self.kind}, STATED ({self.source}): {self.flops / 1e12:g} TFLOP/s peak x MFU {self.mfu:g}, "
                f"generation memory-bound at {self.memory_bandwidth / 1e9:g} GB/s, {self.call_overhead_s * 1e3:g} ms "
                f"per layer per call, stage process start {self.process_start_s:g} s + dvc {self.dvc_stage_s:g} s")


# Stated assumptions per device kind (docs/estimate.md says where each comes from).
ASSUMED = {
    # A100-80GB: 312 TFLOP/s dense 16-bit (fp32 matmuls run as TF32 at half that), HBM2e 2.0 TB/s;
    # MFU 0.35 is what well-fed PPO/RLHF training steps reach; ~0.1 ms of launches per layer per call.
    "cuda": Throughput("cuda", flops=312e12, mfu=0.35, memory_bandwidth=2.0e12, call_overhead_s=1e-4,
                       process_start_s=8.0, dvc_stage_s=2.0, source="A100-80GB figures"),
    # A 2-core x86 VM (rough figures; `drlc estimate --calibrate` measures the real ones): ~50 GFLOP/s
    # fp32 peak (2 cores x 2 FMA x 8 lanes x ~1.5 GHz effective), MFU 0.3, ~10 GB/s DRAM, ~0.3 ms of
    # PyTorch dispatch per layer per call.
    "cpu": Throughput("cpu", flops=50e9, mfu=0.3, memory_bandwidth=10e9, call_overhead_s=3e-4,
                      process_start_s=6.0, dvc_stage_s=2.5, source="2-core x86 VM figures"),
}


def assumed(kind: str) -> Throughput:
    """The stated Throughput of device kind 'cpu' or 'cuda' (cuda:N counts as cuda)."""
    return ASSUMED["cuda" if kind.startswith("cuda") else "cpu"]


def forward_s(t: Throughput, params: int, tokens: float, layers: int) -> float:
    """One forward over `tokens` tokens (one call)."""
    if t.measured:
        return _scaled(t.measured["forward"], layers, tokens / t.measured["forward_tokens"])
    return 2 * params * tokens / (t.flops * t.mfu) + layers * t.call_overhead_s


def train_step_s(t: Throughput, params: int, tokens: float, layers: int) -> float:
    """One training step (forward + backward) over `tokens` tokens."""
    if t.measured:
        return _scaled(t.measured["train"], layers, tokens / t.measured["train_tokens"])
    return 6 * params * tokens / (t.flops * t.mfu) + 3 * layers * t.call_overhead_s


def kv_bytes(layers: int, hidden: int, context: float, batch: int, dtype_bytes: int) -> float:
    """Bytes of the KV cache a decoding step reads: keys and values of every layer and position."""
    return 2 * layers * hidden * context * batch * dtype_bytes


def decode_step_s(t: Throughput, params: int, weight_bytes: int, kv: float, batch: int, layers: int) -> float:
    """One decoding step of `batch` sequences: memory-bound unless the batch makes it compute-bound."""
    if t.measured:
        return _scaled(t.measured["decode"], layers, batch / t.measured["decode_batch"])
    memory = (weight_bytes + kv) / t.memory_bandwidth
    compute = 2 * params * batch / (t.flops * t.mfu)
    return max(memory, compute) + layers * t.call_overhead_s


def _scaled(base_per_layer: tuple[float, float], layers: int, size_ratio: float) -> float:
    """A measured call (base + layers x per-layer) for `layers`; a larger call than measured scales linearly."""
    base, per_layer = base_per_layer
    return (base + layers * per_layer) * max(1.0, size_ratio)


# ---- calibration ---------------------------------------------------------------------------------

def _timed(fn, repeats: int) -> float:
    fn()  # warm-up (allocations, kernel selection)
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def _model_calls(config, layers: int, device, *, train_batch: int, seq: int, decode_batch: int, context: int):
    """(forward_s, train_s, decode_s) of a causal LM of `config` with `layers` layers, random weights."""
    import torch
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(config)
    for name in ("n_layer", "num_hidden_layers"):
        if hasattr(config, name):
            setattr(config, name, layers)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(device)
    vocab = config.vocab_size
    ids = torch.randint(0, vocab, (train_batch, seq), device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def forward():
        with torch.no_grad():
            model(ids)
        sync()

    def train():
        model(ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)
        sync()

    with torch.no_grad():
        prompt = torch.randint(0, vocab, (decode_batch, context), device=device)
        past = model(prompt, use_cache=True).past_key_values
    step_ids = torch.randint(0, vocab, (decode_batch, 1), device=device)

    def decode():
        with torch.no_grad():
            model(step_ids, past_key_values=copy.copy(past), use_cache=True)
        sync()

    return _timed(forward, 3), _timed(train, 3), _timed(decode, 5)


def _subprocess_s(args: list[str], cwd=".") -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], check=True, capture_output=True, cwd=cwd)
    return time.perf_counter() - start


def calibrate(config, device, *, train_batch: int, seq: int, decode_batch: int, context: int,
              stage_imports: str = "import torch, transformers, pyarrow", root=".") -> Throughput:
    """Measured Throughput of `config`'s model shape on `device` (see the module docstring): a few seconds."""
    layers = getattr(config, "n_layer", None) or config.num_hidden_layers
    depths = (1, 2) if layers >= 2 else (1,)
    calls = [_model_calls(config, d, device, train_batch=train_batch, seq=seq, decode_batch=decode_batch,
                          context=context) for d in depths]
    measured = {}
    for i, name in enumerate(("forward", "train", "decode")):
        one = calls[0][i]
        per_layer = max(0.0, calls[-1][i] - one) if len(calls) > 1 else one / 2
        measured[name] = (max(0.0, one - per_layer), per_layer)
    measured.update(forward_tokens=train_batch * seq, train_tokens=train_batch * seq, decode_batch=decode_batch)
    kind = "cuda" if device.type == "cuda" else "cpu"
    return replace(assumed(kind), source="measured", measured=measured,
                   process_start_s=_subprocess_s(["-c", stage_imports]),
                   dvc_stage_s=_subprocess_s(["-m", "dvc", "stage", "list"], cwd=root))
