"""How fast a device generates tokens and trains: stated assumptions per device kind, or measured (calibrate).

The run-time estimate of `drlc estimate` (pipeline/commands/runtime.py) prices every stage with one
`Throughput`. Formulas (docs/estimate.md, each unit-tested against a hand computation):

- a forward over T tokens: 2 x params x T FLOPs at flops x mfu, plus layers x call_overhead_s;
- training a minibatch: (2 x params + 2 x params + 2 x trainable) x T FLOPs: the forward, the
  activation gradients and the weight gradients of the trainable weights only (6 x params x T when
  every weight trains; about 4 x params x T with LoRA adapters);
- one decoding step of a batch: memory-bound, max((weight bytes + KV bytes) / memory_bandwidth,
  2 x params x batch / (flops x mfu)) + layers x call_overhead_s; KV bytes = 2 x layers x hidden x
  context x batch x dtype bytes;
- a stage process: process_start_s (Python and the stage's imports; measured per stage when
  calibrated) + dvc_stage_s (`dvc repro -s`'s own work: reading dvc.yaml, hashing deps and outs);
- loading a model folder of B bytes: load_call_s + B / load_bps (from_pretrained: config, model
  init, weights); writing a checkpoint of B bytes: B / write_bps (save_pretrained).

`calibrate` measures the same quantities on the local device in seconds: it builds the model
shape with 1 and 2 layers (random weights), times a few training steps and decoding steps of each
and extrapolates to the full depth (time = base + layers x per-layer); times save_pretrained and
from_pretrained of the 2-layer model and from_pretrained of a tiny one (the fixed cost of a load);
times, in fresh interpreters, each per-round stage's imports (the import closure of its stage
script, pipeline/core/code_deps.py), a `dvc repro` of a one-line stage in a scratch project (DVC's
own work per stage) and `dvc stage list` in the project (reading its dvc.yaml and params).
"""
from __future__ import annotations

import copy
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path


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
    load_call_s: float = 0.0  # fixed seconds of loading one model folder (config, model init, tokenizer)
    load_bps: float = 1e9  # bytes/s of loading a model folder's weights
    write_bps: float = 1e9  # bytes/s of writing a checkpoint (save_pretrained)
    # calibrated: measured seconds per call, {"train"|"decode": (base_s, per_layer_s)}, else empty
    measured: dict | None = None
    stage_start_s: dict | None = None  # calibrated: {stage: seconds of its process's imports}

    def start_s(self, stage: str) -> float:
        """Seconds before a stage's own work: its process start (measured per stage when calibrated) and DVC's."""
        return (self.stage_start_s or {}).get(stage, self.process_start_s) + self.dvc_stage_s

    def describe(self) -> str:
        if self.measured:
            return (f"{self.kind}, MEASURED on this machine (--calibrate): " + ", ".join(
                f"{name} {self.measured[name][0] * 1e3:.2f} ms + {self.measured[name][1] * 1e3:.2f} ms/layer"
                for name in ("forward", "train", "decode"))
                + "; stage process start " + ", ".join(f"{k} {v:.1f} s" for k, v in (self.stage_start_s or {}).items())
                + f"; dvc per stage {self.dvc_stage_s:.1f} s; model load {self.load_call_s:.1f} s + "
                f"{self.load_bps / 1e9:.2f} GB/s, write {self.write_bps / 1e9:.2f} GB/s")
        return (f"{self.kind}, STATED ({self.source}): {self.flops / 1e12:g} TFLOP/s peak x MFU {self.mfu:g}, "
                f"generation memory-bound at {self.memory_bandwidth / 1e9:g} GB/s, {self.call_overhead_s * 1e3:g} ms "
                f"per layer per call, stage process start {self.process_start_s:g} s + dvc {self.dvc_stage_s:g} s, "
                f"model load {self.load_call_s:g} s + {self.load_bps / 1e9:g} GB/s, "
                f"write {self.write_bps / 1e9:g} GB/s")


# Stated assumptions per device kind (docs/estimate.md says where each comes from).
ASSUMED = {
    # A100-80GB: 312 TFLOP/s dense 16-bit (fp32 matmuls run as TF32 at half that), HBM2e 2.0 TB/s;
    # MFU 0.35 is what well-fed PPO/RLHF training steps reach; ~0.1 ms of launches per layer per call.
    # A stage process on a GPU machine: 8 s of imports and CUDA initialisation, 2 s of DVC; a model folder
    # loads in 2 s + 2 GB/s (NVMe, then host to device), a checkpoint writes at 1 GB/s.
    "cuda": Throughput("cuda", flops=312e12, mfu=0.35, memory_bandwidth=2.0e12, call_overhead_s=1e-4,
                       process_start_s=8.0, dvc_stage_s=2.0, source="A100-80GB figures",
                       load_call_s=2.0, load_bps=2e9, write_bps=1e9),
    # A 2-core AVX-512 x86 VM like the project's CI machine (`drlc estimate --calibrate` measures the real
    # figures): 320 GFLOP/s fp32 peak (2 cores x 2 FMA units x 16 lanes x 2 FLOP x ~2.5 GHz; an AVX2-only
    # CPU has half), MFU 0.3, ~10 GB/s DRAM, ~0.3 ms of PyTorch dispatch per layer per call; a stage
    # process: 3 s of Python, torch and transformers imports and 1.5 s of DVC (1.5-2.9 s and ~1 s measured
    # there); a model folder loads in 1 s (from_pretrained in a fresh process: its model classes imported;
    # 1.7 s measured there) + 2 GB/s (a checkpoint just written is in the page cache), a checkpoint
    # writes at 0.5 GB/s (0.8 GB/s measured there).
    "cpu": Throughput("cpu", flops=320e9, mfu=0.3, memory_bandwidth=10e9, call_overhead_s=3e-4,
                      process_start_s=3.0, dvc_stage_s=1.5, source="2-core AVX-512 x86 VM figures",
                      load_call_s=1.0, load_bps=2e9, write_bps=0.5e9),
}


def assumed(kind: str) -> Throughput:
    """The stated Throughput of device kind 'cpu' or 'cuda' (cuda:N counts as cuda)."""
    return ASSUMED["cuda" if kind.startswith("cuda") else "cpu"]


def forward_s(t: Throughput, params: int, tokens: float, layers: int) -> float:
    """One forward over `tokens` tokens (one call)."""
    if t.measured:
        return _scaled(t.measured["forward"], layers, tokens / t.measured["forward_tokens"])
    return 2 * params * tokens / (t.flops * t.mfu) + layers * t.call_overhead_s


def train_step_s(t: Throughput, params: int, tokens: float, layers: int, trainable: int | None = None) -> float:
    """One training step (forward + backward) over `tokens` tokens; `trainable` weights get gradients (None: all)."""
    share = (4 * params + 2 * (params if trainable is None else trainable)) / (6 * params) if params else 1.0
    if t.measured:  # calibrate trains every weight: its time scaled by the FLOP share
        return _scaled(t.measured["train"], layers, tokens / t.measured["train_tokens"]) * share
    return 6 * params * share * tokens / (t.flops * t.mfu) + 3 * layers * t.call_overhead_s


def load_s(t: Throughput, folders: int, size: float) -> float:
    """Loading `folders` model folders of `size` bytes in all."""
    return folders * t.load_call_s + size / t.load_bps


def write_s(t: Throughput, size: float) -> float:
    """Writing a checkpoint of `size` bytes."""
    return size / t.write_bps


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

    config = _with_layers(config, layers)
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


def _folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())


def _load_write(config) -> tuple[float, float, float]:
    """(load_call_s, load_bps, write_bps): save_pretrained and from_pretrained of `config`'s shape with 2 layers,
    and from_pretrained of a 1-layer, 32-wide, 64-token model (its time is the fixed cost of any load)."""
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM

    def saved(cfg, folder: Path) -> float:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg)
        start = time.perf_counter()
        model.save_pretrained(folder)
        return time.perf_counter() - start

    def loaded(folder: Path) -> float:  # in a fresh interpreter, as a stage loads it (model classes imported then)
        out = subprocess.run([sys.executable, "-c", LOAD_TIMER, str(folder)], check=True, capture_output=True,
                             text=True)
        return float(out.stdout.split()[-1])

    with tempfile.TemporaryDirectory() as tmp:
        big, tiny = Path(tmp) / "big", Path(tmp) / "tiny"
        save = saved(_with_layers(config, 2), big)
        small = _with_layers(config, 1)
        for name, value in (("vocab_size", 64), ("n_embd", 32), ("hidden_size", 32), ("intermediate_size", 64),
                            ("n_head", 2), ("num_attention_heads", 2), ("num_key_value_heads", 2), ("head_dim", 16)):
            if hasattr(small, name):
                setattr(small, name, value)
        saved(small, tiny)
        call, size = loaded(tiny), _folder_bytes(big)
        return call, size / max(loaded(big) - call, 1e-3), size / max(save, 1e-3)


LOAD_TIMER = ("import sys, time; from transformers import AutoModelForCausalLM; start = time.perf_counter(); "
              "AutoModelForCausalLM.from_pretrained(sys.argv[1]); print(time.perf_counter() - start)")


def _with_layers(config, layers: int):
    config = copy.deepcopy(config)
    for name in ("n_layer", "num_hidden_layers"):
        if hasattr(config, name):
            setattr(config, name, layers)
    return config


def _dvc_stage_s(root) -> float:
    """DVC's own work per stage: `dvc repro` of a one-line stage in a scratch project, plus reading the project's
    dvc.yaml (`dvc stage list` in root) beyond an interpreter's start."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        _subprocess_s(["-m", "dvc", "init", "-q", "--no-scm"], cwd=tmp)
        Path(tmp, "dvc.yaml").write_text("stages:\n  one:\n    cmd: python -c \"open('out', 'w')\"\n"
                                         "    outs: [out]\n")
        repro = _subprocess_s(["-m", "dvc", "repro", "-q"], cwd=tmp)
    listed = _subprocess_s(["-m", "dvc", "stage", "list"], cwd=root)
    return repro + max(0.0, listed - _subprocess_s(["-c", "pass"]))


def calibrate(config, device, *, train_batch: int, seq: int, decode_batch: int, context: int,
              stage_imports: dict[str, str] | None = None, root=".") -> Throughput:
    """Measured Throughput of `config`'s model shape on `device` (see the module docstring): seconds to a minute.

    stage_imports: {stage: python code importing what its process imports}; None = torch, transformers, pyarrow.
    """
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
    imports = stage_imports or {"stage": "import torch, transformers, pyarrow"}
    starts = {stage: _subprocess_s(["-c", code], cwd=root) for stage, code in imports.items()}
    load_call_s, load_bps, write_bps = _load_write(config)
    return replace(assumed(kind), source="measured", measured=measured, stage_start_s=starts,
                   process_start_s=max(starts.values()), dvc_stage_s=_dvc_stage_s(root),
                   load_call_s=load_call_s, load_bps=load_bps, write_bps=write_bps)
