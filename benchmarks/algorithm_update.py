"""Time one update of each ppo.algorithm against PPO at the same shape, as ratios, with peak memory.

One round of train_round (pipeline/train/trainer.py) on a GPT-2 built from GPT2Config (vocab 50257), random
token ids: batch 16 responses = 4 prompts x 4 samples, query 8 and response 20 tokens, ppo_epochs 4, minibatch 16.
Arms: ppo (GAE + value head) and the value-free grpo (loss types grpo, dr_grpo, dapo), rloo, reinforce_pp (no
value head), all with the critic's per-token rewards on (dense_weight 1, a span reward on every 5th token).
Each arm runs in its own process (so its peak RSS, `peak_rss_mb`, is its own; on CUDA also the peak
`torch.cuda.max_memory_allocated`, `peak_gpu_mb`): --warmup discarded repeats, then --repeats timed ones, the
policy reset to its start weights outside the timer. The ppo arm runs first and again last (`ppo_again`), so
drift in the machine's load shows; ratios are against the mean of the two ppo medians.

Usage:  python benchmarks/algorithm_update.py [--shape gpt2-4x256] [--repeats 5] [--device cpu]
Writes benchmarks/results/algorithm_update.json (sorted keys).
"""
from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {"gpt2-2x128": (2, 128, 4), "gpt2-4x256": (4, 256, 4), "gpt2-small-12x768": (12, 768, 12)}
ARMS = {  # name: (algorithm, loss_type)
    "ppo": ("ppo", "grpo"), "grpo": ("grpo", "grpo"), "dr_grpo": ("grpo", "dr_grpo"), "dapo": ("grpo", "dapo"),
    "rloo": ("rloo", "grpo"), "reinforce_pp": ("reinforce_pp", "grpo"),
}
VOCAB, BATCH, GROUP, QUERY_LEN, RESPONSE_LEN, PPO_EPOCHS, MINI_BATCH = 50257, 16, 4, 8, 20, 4, 16


def worker(arm: str, shape: str, device: str, warmup: int, repeats: int) -> dict:
    """One arm's medians and peaks (runs in its own process)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from pipeline.core.config import PPOParams
    from pipeline.model.policy import PolicyWithValueHead, _fresh_value_head, frozen_copy
    from pipeline.train.ppo import FixedKLController, RunningMoments
    from pipeline.train.trainer import RolloutBatch, make_optimizer, train_round

    torch.manual_seed(0)
    algorithm, loss_type = ARMS[arm]
    n_layer, n_embd, n_head = SHAPES[shape]
    lm = GPT2LMHeadModel(GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=VOCAB, n_positions=64))
    head = _fresh_value_head(n_embd, 0) if algorithm == "ppo" else None
    policy = PolicyWithValueHead(lm, head).to(device).eval()
    reference = frozen_copy(policy)
    start = {k: v.clone() for k, v in policy.state_dict().items()}
    gen = torch.Generator().manual_seed(1)
    queries = torch.randint(2, VOCAB, (BATCH // GROUP, QUERY_LEN), generator=gen).repeat_interleave(GROUP, 0)
    batch = RolloutBatch(
        queries.tolist(), torch.randint(2, VOCAB, (BATCH, RESPONSE_LEN), generator=gen).tolist(),
        (-torch.rand(BATCH, RESPONSE_LEN, generator=gen) * 5 - 5).tolist(), torch.randn(BATCH, generator=gen).tolist(),
        [[-0.5 if t % 5 == 4 else 0.0 for t in range(RESPONSE_LEN)] for _ in range(BATCH)])
    params = PPOParams(ppo_epochs=PPO_EPOCHS, mini_batch_size=MINI_BATCH, algorithm=algorithm, loss_type=loss_type,
                       vf_coef=0.1 if algorithm == "ppo" else 0.0, ratio_threshold=1e9, init_kl_coef=0.04)
    cuda = device.startswith("cuda")
    times = []
    for i in range(warmup + repeats):
        policy.load_state_dict(start)
        optimizer = make_optimizer(policy, params.learning_rate)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        began = time.perf_counter()
        train_round(policy=policy, ref_model=reference, optimizer=optimizer, batch=batch, params=params,
                    kl_controller=FixedKLController(0.04), score_moments=RunningMoments(), seed=0, progress=False,
                    group_size=GROUP, max_completion_length=RESPONSE_LEN)
        if cuda:
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - began)
    result = {"median_s": statistics.median(times), "times_s": times,
              "value_head_params": 0 if head is None else sum(p.numel() for p in head.parameters()),
              "trainable_params": sum(p.numel() for p in policy.parameters() if p.requires_grad),
              "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if cuda:
        result["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return result


def run_arm(arm: str, args) -> dict:
    command = [sys.executable, __file__, "--worker", arm, "--shape", args.shape, "--device", args.device,
               "--warmup", str(args.warmup), "--repeats", str(args.repeats)]
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": str(args.threads)})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="gpt2-4x256", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "algorithm_update.json"))
    args = parser.parse_args()
    if args.worker:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(worker(args.worker, args.shape, args.device, args.warmup, args.repeats)))
        return
    arms = {arm: run_arm(arm, args) for arm in ARMS}
    arms["ppo_again"] = run_arm("ppo", args)
    ppo_s = (arms["ppo"]["median_s"] + arms["ppo_again"]["median_s"]) / 2
    ratios = {arm: arms[arm]["median_s"] / ppo_s for arm in ARMS}
    result = {"shape": args.shape, "device": args.device, "batch": BATCH, "group": GROUP, "query_len": QUERY_LEN,
              "response_len": RESPONSE_LEN, "ppo_epochs": PPO_EPOCHS, "mini_batch": MINI_BATCH,
              "repeats": args.repeats, "warmup": args.warmup, "threads": args.threads,
              "machine": {"python": platform.python_version(), "processor": platform.processor() or platform.machine()},
              "arms": arms, "ratio_to_ppo": ratios,
              "peak_rss_mb_without_head_minus_with": {arm: arms[arm]["peak_rss_mb"] - arms["ppo"]["peak_rss_mb"]
                                                      for arm in ARMS if arm != "ppo"}}
    Path(args.out).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    for arm in [*ARMS, "ppo_again"]:
        a = arms[arm]
        print(f"{arm:>13}: {a['median_s']:.3f} s  x{a['median_s'] / ppo_s:.3f} of ppo  peak RSS {a['peak_rss_mb']:.0f} MB"
              + (f"  peak GPU {a['peak_gpu_mb']:.0f} MB" if "peak_gpu_mb" in a else ""))


if __name__ == "__main__":
    main()
