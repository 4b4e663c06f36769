"""Time one PPO update: drlc's train_round vs the bare forward+backward floor vs legacy TRL 0.11.4.

Settings (the issue's): batch 16, query 8 tokens, response 20 tokens, ppo_epochs 4, minibatch 16,
GPT-2 shapes built from GPT2Config (vocab 50257, dropout at its defaults), random token ids.
Each measured thing lives in its own persistent worker process (so peak RSS is per thing):

  drlc-fp32 / drlc-bf16   pipeline.train.trainer.train_round (the policy is reset to its start weights
                          before each repeat, outside the timer, so every repeat does the same work)
  floor-fp32 / floor-bf16 the model work any PPO round must do, nothing else: 2 no-grad forwards
                          over the batch (policy, reference) + ppo_epochs × minibatches of
                          forward + backward of a scalar loss on the full logits; the Adam steps are
                          timed apart (`adam_s`)
  trl-fp32                trl 0.11.4 PPOTrainer.step, run with --trl-python (its own venv)
  drlc-baseline-<p>       train_round of another drlc checkout (--baseline-tree), to show a change
                          made the update no slower in the same interleaved repeats

Repeats are interleaved (one repeat of every worker, in a rotating order, then the next), so
machine load hits all alike. Medians over --repeats after --warmup discarded repeats.

Usage:  python benchmarks/ppo_update.py [--repeats 5] [--trl-python /tmp/trl-venv/bin/python]
Writes benchmarks/results/ppo_update.json (sorted keys).

On a GPU, `--device cuda --shapes gpt2-large-36x1280` times the paper's policy shape (gpt2-large:
36 blocks, 1280 wide, 20 heads, GPT-2's 1024 positions); workers then also report the peak
`torch.cuda.max_memory_allocated` of their timed repeats (`peak_gpu_mb`). benchmarks/gpu_check.py
drives these workers on a CUDA machine.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {  # name: (n_layer, n_embd, n_head)
    "gpt2-2x128": (2, 128, 4),
    "gpt2-4x256": (4, 256, 4),
    "gpt2-small-12x768": (12, 768, 12),
    "gpt2-large-36x1280": (36, 1280, 20),  # the paper's policy; a GPU shape (not in the default --shapes)
}
CPU_SHAPES = ("gpt2-2x128", "gpt2-4x256", "gpt2-small-12x768")  # the default --shapes
N_POSITIONS = {"gpt2-large-36x1280": 1024}  # gpt2-large's own table; the CPU shapes keep 64 (8 + 20 tokens fit)
VOCAB, BATCH, QUERY_LEN, RESPONSE_LEN, PPO_EPOCHS, MINI_BATCH = 50257, 16, 8, 20, 4, 16
TRL_MEASURED_BY_ISSUE_AUTHOR = {"gpt2-2x128": 0.28, "gpt2-4x256": 0.60}  # s, idle machine, fp32


# ----------------------------------------------------------------------------- workers
def _config(shape: str):
    from transformers import GPT2Config

    n_layer, n_embd, n_head = SHAPES[shape]
    return GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=VOCAB,
                      n_positions=N_POSITIONS.get(shape, 64))


def _random_batch():
    import torch

    generator = torch.Generator().manual_seed(0)
    queries = torch.randint(0, VOCAB - 1, (BATCH, QUERY_LEN), generator=generator)  # (B, Q)
    responses = torch.randint(0, VOCAB - 1, (BATCH, RESPONSE_LEN), generator=generator)  # (B, R)
    env_rewards = torch.randn(BATCH, generator=generator)  # (B,)
    return queries, responses, env_rewards


def _synchronize(device) -> None:
    """Wait for the device's queued kernels, so a timer stopped after it measures them (no-op on CPU)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _drlc_worker(shape: str, precision: str, device):
    """The pipeline timed is the one first on the worker's path: PYTHONPATH, set by `Worker` to this tree or
    to the --baseline-tree."""
    import torch
    from transformers import GPT2LMHeadModel

    from pipeline.core.config import PPOParams
    from pipeline.model.logprobs import response_logprobs
    from pipeline.model.policy import PolicyWithValueHead, _fresh_value_head, frozen_copy
    from pipeline.train.ppo import AdaptiveKLController, RunningMoments
    from pipeline.train.trainer import RolloutBatch, make_optimizer, train_round

    torch.manual_seed(0)
    with device:  # built where it runs: a gpt2-large random init on the CPU alone takes many seconds
        lm = GPT2LMHeadModel(_config(shape))
    policy = PolicyWithValueHead(lm, _fresh_value_head(SHAPES[shape][1], 0)).to(device).eval()
    ref = frozen_copy(policy)
    queries, responses, env_rewards = _random_batch()
    with torch.no_grad():  # behaviour log-probs as the fp32 rollout stage records them
        behaviour = response_logprobs(policy, query_ids=queries.tolist(), response_ids=responses.tolist(),
                                       pad_id=0).logprobs
    batch = RolloutBatch(queries.tolist(), responses.tolist(), behaviour.tolist(), env_rewards.tolist(),
                         [[0.0] * RESPONSE_LEN for _ in range(BATCH)])
    params = PPOParams(learning_rate=1.41e-5, ppo_epochs=PPO_EPOCHS, mini_batch_size=MINI_BATCH,  # TRL's lr
                       mixed_precision="bf16" if precision == "bf16" else "fp32")
    optimizer = make_optimizer(policy, params.learning_rate)
    # kept in host memory, so a GPU's peak memory holds only what a real round holds
    start_weights = {k: v.detach().to("cpu", copy=True) for k, v in policy.state_dict().items()}

    def run():
        policy.load_state_dict(start_weights)
        controller = AdaptiveKLController(params.init_kl_coef, params.target, params.horizon)
        _synchronize(device)
        started = time.perf_counter()
        steps = train_round(policy=policy, ref_model=ref, optimizer=optimizer, batch=batch, params=params,
                            kl_controller=controller, score_moments=RunningMoments(), seed=0, progress=False)
        _synchronize(device)
        seconds = time.perf_counter() - started
        first = steps[0]
        return {"seconds": seconds, "skipped": sum(s["skipped"] for s in steps),
                "first_policy_kl": first["policy_kl"], "behaviour_logprob_gap": first["behaviour_logprob_gap"]}

    return run


def _floor_worker(shape: str, precision: str, device):
    import contextlib

    import torch
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    with device:
        model = GPT2LMHeadModel(_config(shape)).eval()
    optimizer = torch.optim.Adam(model.parameters(), lr=1.41e-5)
    queries, responses, _ = _random_batch()
    input_ids = torch.cat([queries, responses], dim=1).to(device)  # (B, L)
    attention = torch.ones_like(input_ids)  # (B, L)

    def autocast():
        if precision == "bf16":
            return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def forward(ids, mask):
        with autocast():
            return model(input_ids=ids, attention_mask=mask, use_cache=False).logits

    def run():
        _synchronize(device)
        started = time.perf_counter()
        with torch.no_grad():
            for _ in range(2):  # policy and reference passes
                for s in range(0, BATCH, MINI_BATCH):
                    forward(input_ids[s : s + MINI_BATCH], attention[s : s + MINI_BATCH])
        for _ in range(PPO_EPOCHS):
            for s in range(0, BATCH, MINI_BATCH):
                forward(input_ids[s : s + MINI_BATCH], attention[s : s + MINI_BATCH]).float().mean().backward()
        _synchronize(device)
        seconds = time.perf_counter() - started
        adam_started = time.perf_counter()
        for _ in range(PPO_EPOCHS * (BATCH // MINI_BATCH)):
            optimizer.step()
        _synchronize(device)
        adam = time.perf_counter() - adam_started
        optimizer.zero_grad(set_to_none=True)
        return {"seconds": seconds, "adam_s": adam}

    return run


def _trl_worker(shape: str, precision: str, device):
    import numpy as np
    import torch
    from tokenizers import Tokenizer, models
    from transformers import GPT2LMHeadModel, PreTrainedTokenizerFast
    from trl import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer

    assert precision == "fp32", "the TRL baseline runs in fp32 only"
    # TRL's own Accelerator picks the device: CUDA whenever the venv's torch sees one
    assert (device.type == "cuda") == torch.cuda.is_available(), f"TRL cannot be told to run on {device}"
    torch.manual_seed(0)
    np.random.seed(0)
    model = AutoModelForCausalLMWithValueHead.from_pretrained(GPT2LMHeadModel(_config(shape)))
    vocab = {"<pad>": 0, **{f"w{i}": i for i in range(1, VOCAB)}}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<pad>")),
                                        pad_token="<pad>", eos_token=f"w{VOCAB - 1}")
    config = PPOConfig(batch_size=BATCH, mini_batch_size=MINI_BATCH, ppo_epochs=PPO_EPOCHS, seed=0)
    trainer = PPOTrainer(config=config, model=model, ref_model=None, tokenizer=tokenizer)
    queries, responses, env_rewards = _random_batch()
    q, r, s = list(queries), list(responses), list(env_rewards)

    def run():
        _synchronize(device)
        started = time.perf_counter()
        trainer.step(q, r, s)
        _synchronize(device)
        return {"seconds": time.perf_counter() - started}

    return run


def worker_main(kind: str, shape: str, precision: str, threads: int, device: str = "cpu") -> None:
    """Serve `run` / `stats` commands on stdin, one JSON line per answer on stdout.

    On a CUDA device each `run` answer carries `peak_gpu_mb`, the peak allocated memory of that
    repeat (the models, Adam state and the round's activations), and `stats` the peak of all.
    """
    import torch

    torch.set_num_threads(threads)
    device = torch.device(device)
    if kind == "drlc":
        run = _drlc_worker(shape, precision, device)
    else:
        run = {"floor": _floor_worker, "trl": _trl_worker}[kind](shape, precision, device)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.strip() == "run":
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            result = run()
            if device.type == "cuda":
                result["peak_gpu_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
            print(json.dumps(result), flush=True)
        elif line.strip() == "stats":
            peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
            stats = {"peak_rss_mb": peak_mb}
            if device.type == "cuda":
                stats["allocated_gpu_mb"] = torch.cuda.memory_allocated(device) / 2**20
            print(json.dumps(stats), flush=True)


# ----------------------------------------------------------------------------- orchestrator
class Worker:
    """A persistent worker subprocess answering one JSON line per command."""

    def __init__(self, python: str, kind: str, shape: str, precision: str, threads: int, device: str = "cpu",
                 root: Path | None = None):
        self.name = f"{kind}-{precision}" if root is None else f"{kind}-baseline-{precision}"
        cmd = [python, str(Path(__file__).resolve()), "--worker", kind, "--shape", shape,
               "--precision", precision, "--threads", str(threads), "--device", device]
        # the drlc tree whose pipeline the worker imports: first on its path, ahead of the installed one
        tree = os.pathsep.join(filter(None, [str(root or ROOT), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": tree, "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error",
               "PYTHONWARNINGS": "ignore"}
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                     cwd=str(ROOT))
        self.results: list[dict] = []
        ready = self._read()
        assert ready.get("ready"), ready

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.name} died (exit {self.proc.wait()})")
        return json.loads(line)

    def ask(self, command: str) -> dict:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> dict:
        stats = self.ask("stats")
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        return stats


def summarise(results: list[dict], peak: dict) -> dict:
    times = [r["seconds"] for r in results]
    out = {"median_s": statistics.median(times), "min_s": min(times), "times_s": times,
           "response_tokens_per_s": BATCH * RESPONSE_LEN / statistics.median(times), **peak}
    for key in ("adam_s", "skipped", "first_policy_kl", "behaviour_logprob_gap"):
        if key in results[0]:
            out[key] = statistics.median(r[key] for r in results)
    if "peak_gpu_mb" in results[0]:
        out["peak_gpu_mb"] = max(r["peak_gpu_mb"] for r in results)
    return out


def bench_shape(shape: str, args) -> dict:
    specs = [(sys.executable, kind, precision) for precision in args.precisions for kind in ("drlc", "floor")]
    if args.trl_python:
        specs.append((args.trl_python, "trl", "fp32"))
    workers = [Worker(python, kind, shape, precision, args.threads, args.device) for python, kind, precision in specs]
    if args.baseline_tree:
        workers += [Worker(sys.executable, "drlc", shape, precision, args.threads, args.device, args.baseline_tree)
                    for precision in args.precisions]
    load_before = os.getloadavg()
    repeats = args.large_repeats if shape in ("gpt2-small-12x768", "gpt2-large-36x1280") else args.repeats
    for repeat in range(args.warmup + repeats):
        shift = repeat % len(workers)
        for worker in workers[shift:] + workers[:shift]:  # rotating order
            result = worker.ask("run")
            if repeat >= args.warmup:
                worker.results.append(result)
        print(f"  {shape} repeat {repeat + 1}/{args.warmup + repeats}", file=sys.stderr, flush=True)
    row = {"loadavg_before": load_before, "loadavg_after": os.getloadavg()}
    for worker in workers:
        row[worker.name.replace("-", "_")] = summarise(worker.results, worker.close())
    for precision in args.precisions:
        drlc = row[f"drlc_{precision}"]["median_s"]
        row[f"drlc_over_floor_{precision}"] = drlc / row[f"floor_{precision}"]["median_s"]
        if "trl_fp32" in row:
            row[f"drlc_{precision}_over_trl_fp32"] = drlc / row["trl_fp32"]["median_s"]
        if f"drlc_baseline_{precision}" in row:
            row[f"drlc_over_baseline_{precision}"] = drlc / row[f"drlc_baseline_{precision}"]["median_s"]
    return row


def default_precisions(device: str) -> str:
    from pipeline.model.logprobs import cpu_has_native_bf16

    return "fp32,bf16" if device.startswith("cuda") or cpu_has_native_bf16() else "fp32"


def trl_status(trl_python: str | None) -> tuple[str | None, str | None]:
    """(python to use, reason it is missing)."""
    if not trl_python:
        return None, "no --trl-python given"
    if not Path(trl_python).exists():
        return None, f"{trl_python} does not exist: create the venv (see docs/ppo.md)"
    probe = subprocess.run([trl_python, "-c", "import trl, transformers"], capture_output=True, text=True)
    if probe.returncode != 0:
        return None, f"importing trl with {trl_python} failed: {probe.stderr.strip().splitlines()[-1:]}"
    return trl_python, None


def baseline_info(tree: Path | None) -> dict | None:
    """The --baseline-tree and the commit checked out there."""
    if tree is None:
        return None
    if not (tree / "pipeline" / "train" / "trainer.py").is_file():
        raise SystemExit(f"--baseline-tree {tree} is not a drlc checkout (no pipeline/train/trainer.py; "
                         f"checkouts before the layered pipeline/ are not supported): "
                         f"make one with `git worktree add {tree} <commit>`.")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True).stdout.strip()
    return {"tree": str(tree), "commit": commit or None}


def machine_info(args, trl_python) -> dict:
    import torch

    from pipeline.model.logprobs import cpu_has_native_bf16  # recorded: bf16 is emulated, and slow, without it

    info = {"cpu_count": os.cpu_count(), "torch": torch.__version__, "threads": args.threads,
            "python": platform.python_version(), "platform": platform.platform(), "processor": platform.processor(),
            "cpu_native_bf16": cpu_has_native_bf16()}
    if trl_python:
        probe = subprocess.run([trl_python, "-c", "import trl, transformers, torch; "
                                "print(trl.__version__, transformers.__version__, torch.__version__)"],
                               capture_output=True, text=True)
        info["trl_venv_versions"] = dict(zip(("trl", "transformers", "torch"), probe.stdout.split()))
    import transformers

    info["transformers"] = transformers.__version__
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--large-repeats", type=int, default=3, help="repeats for gpt2-small-12x768 and gpt2-large")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--shapes", default=",".join(CPU_SHAPES))
    parser.add_argument("--trl-python", default="/tmp/trl-venv/bin/python")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "ppo_update.json"))
    parser.add_argument("--baseline-tree", type=Path, default=None,
                        help="another drlc checkout (e.g. `git worktree add /tmp/base HEAD~1`): its train_round is "
                             "timed in the same interleaved repeats as drlc_baseline_<precision>")
    parser.add_argument("--worker", choices=("drlc", "floor", "trl"))
    parser.add_argument("--shape", choices=tuple(SHAPES))
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda / cuda:N (the workers' device)")
    parser.add_argument("--precisions", default=None,
                        help="fp32,bf16 (default), or fp32 alone on a CPU without native bf16 (emulated bf16 takes "
                             "many CPU-minutes per update there)")
    args = parser.parse_args()
    if args.worker:
        worker_main(args.worker, args.shape, args.precision, args.threads, args.device)
        return
    args.precisions = (args.precisions or default_precisions(args.device)).split(",")
    if not set(args.precisions) <= {"fp32", "bf16"}:
        parser.error(f"--precisions {','.join(args.precisions)}: use fp32, bf16 or fp32,bf16")
    trl_python, trl_missing = trl_status(args.trl_python)
    args.trl_python = trl_python
    result = {
        "settings": {"device": args.device, "precisions": args.precisions, "batch": BATCH, "query_len": QUERY_LEN,
                     "response_len": RESPONSE_LEN, "ppo_epochs": PPO_EPOCHS,
                     "mini_batch": MINI_BATCH, "vocab": VOCAB, "repeats": args.repeats, "warmup": args.warmup,
                     "large_repeats": args.large_repeats,
                     "shapes": {name: dict(zip(("n_layer", "n_embd", "n_head"), SHAPES[name]))
                                for name in args.shapes.split(",")}},
        "machine": machine_info(args, trl_python),
        "trl": None if trl_missing else {"python": trl_python},
        "trl_missing_reason": trl_missing,
        "baseline": baseline_info(args.baseline_tree),
        "trl_measured_by_issue_author_s": TRL_MEASURED_BY_ISSUE_AUTHOR,
        "results": {},
        "loadavg_start": os.getloadavg(),
    }
    for shape in args.shapes.split(","):
        result["results"][shape] = bench_shape(shape, args)
    result["loadavg_end"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print_table(result)


def print_table(result: dict) -> None:
    print(f"{'shape':20} {'what':11} {'median s':>9} {'tok/s':>8} {'peak MB':>8}")
    for shape, row in result["results"].items():
        for name in ("drlc_fp32", "drlc_bf16", "drlc_baseline_fp32", "drlc_baseline_bf16", "floor_fp32", "floor_bf16",
                     "trl_fp32"):
            if name in row:
                r = row[name]
                print(f"{shape:20} {name:11} {r['median_s']:9.3f} {r['response_tokens_per_s']:8.0f} "
                      f"{r['peak_rss_mb']:8.0f}")


if __name__ == "__main__":
    main()
