"""Speed of drlc's sampler (pipeline.model.sampling.sample_responses) vs transformers' `generate`.

Both run on the SAME randomly initialised GPT-2 (built from a config, nothing downloaded), the same
batch of queries (all `query_len` tokens, so no padding), the same `max_new_tokens` and the same
sampling settings: temperature 1, full distribution (generate: do_sample=True, temperature=1.0,
top_k=0, top_p=1.0), KV cache on, and behaviour log-probs of the sampled tokens (generate:
output_logits=True, then log_softmax + gather, the work drlc's sampler does inline). The model has
no EOS (config eos_token_id=None; drlc gets eos_id=-1, an id never sampled), so both always
generate exactly `max_new_tokens` tokens per row. tokens/s counts new tokens (batch *
max_new_tokens) over the wall time of the whole call, prompt pass included. Three cases: the demo's
tiny GPT-2 and GPT-2 small at batch 64 with 8-token prompts, and GPT-2 small at batch 16 with
200-token prompts (summarization-length posts, where the prompt pass weighs most).

Repeats are interleaved (drlc, generate, drlc, generate, ...) after one untimed warm-up each;
medians are reported. Before timing, a cheap agreement check: both samplers' behaviour log-probs
are rescored with one full teacher-forced forward pass (max abs difference), and the mean
behaviour log-prob of drlc's samples is compared with generate's (a z score over rows; the two
draw from the same distribution, so |z| should be small).

Usage:  python benchmarks/sampler_speed.py [--repeats 5] [--out FILE]
Writes benchmarks/results/sampler_speed.json (sorted keys) unless --out. The machine may be shared:
the load average and thread count are recorded next to the timings.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

from pipeline.model.policy import PolicyWithValueHead
from pipeline.model.sampling import sample_responses

ROOT = Path(__file__).resolve().parents[1]

PAD_ID = 0
# name -> GPT-2 shape; "demo" is params.yaml's base model, "gpt2_small" GPT-2 small's shape.
SHAPES = {
    "demo": dict(vocab_size=1024, n_layer=2, n_head=4, n_embd=128, n_positions=64),
    "gpt2_small": dict(vocab_size=50257, n_layer=12, n_head=12, n_embd=768, n_positions=1024),
}
SHAPES["gpt2_small_long_prompt"] = SHAPES["gpt2_small"]  # a summarization-length prompt (LONG_PROMPT)
LONG_PROMPT = {"query_len": 200, "batch": 16}  # the prompt pass dominates: logits there cost the most


# Init std well above GPT-2's 0.02, so next-token distributions are far from uniform (entropy ~4.4
# nats demo, ~2.4 GPT-2 small, vs log V = 6.9 / 10.8) and the mean log-prob check can tell samplers
# apart; speed does not depend on the weights' values.
INIT_STD = 0.2


def build_policy(shape: dict, seed: int = 0) -> PolicyWithValueHead:
    """A random-weight GPT-2 of `shape` with no EOS/BOS, no dropout, wrapped as drlc's policy."""
    torch.manual_seed(seed)
    config = GPT2Config(**shape, bos_token_id=None, eos_token_id=None, pad_token_id=PAD_ID, initializer_range=INIT_STD,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    lm = GPT2LMHeadModel(config).eval()
    lm.generation_config.eos_token_id = None
    lm.generation_config.bos_token_id = None
    lm.generation_config.pad_token_id = PAD_ID
    return PolicyWithValueHead(lm, torch.nn.Linear(shape["n_embd"], 1)).eval()


def make_queries(vocab_size: int, batch: int, query_len: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab_size, (batch, query_len), generator=g).tolist()


def run_drlc(policy, queries, max_new_tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """drlc's sampler; returns (tokens (B, R), behaviour log-probs (B, R))."""
    rows = sample_responses(policy, queries=queries, eos_id=-1, pad_id=PAD_ID, max_new_tokens=max_new_tokens,
                            seed=seed, batch_size=len(queries), progress=False)
    return (torch.tensor([r["response_ids"] for r in rows]),
            torch.tensor([r["behaviour_logprobs"] for r in rows]))


@torch.no_grad()
def run_generate(policy, queries, max_new_tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' generate with the same settings; returns (tokens (B, R), behaviour log-probs (B, R))."""
    input_ids = torch.tensor(queries)  # (B, Q)
    torch.manual_seed(seed)
    out = policy.lm.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=True, temperature=1.0,
                             top_k=0, top_p=1.0, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                             eos_token_id=None, pad_token_id=PAD_ID, use_cache=True,
                             output_logits=True, return_dict_in_generate=True)
    tokens = out.sequences[:, input_ids.shape[1]:]  # (B, R)
    logits = torch.stack(out.logits, 1)  # (B, R, V)
    logprobs = torch.log_softmax(logits.float(), -1).gather(2, tokens[..., None])[..., 0]  # (B, R)
    return tokens, logprobs


@torch.no_grad()
def rescore(policy, queries, tokens: torch.Tensor) -> torch.Tensor:
    """Teacher-forced log-probs (B, R) of `tokens` after `queries` in one full forward pass."""
    ids = torch.cat([torch.tensor(queries), tokens], 1)  # (B, Q + R)
    out = policy.lm(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    logits = out.logits[:, len(queries[0]) - 1 : -1]  # (B, R, V)
    return torch.log_softmax(logits.float(), -1).gather(2, tokens[..., None])[..., 0]


def agreement(policy, queries, drlc, gen) -> dict:
    """Do the two samplers compute the same thing? Rescoring error and a z score of mean log-probs."""
    (t_d, lp_d), (t_g, lp_g) = drlc, gen
    row_d, row_g = lp_d.mean(1), lp_g.mean(1)  # (B,) per-row mean behaviour log-prob
    se = (row_d.var() / len(row_d) + row_g.var() / len(row_g)).sqrt().item()
    diff = (row_d.mean() - row_g.mean()).item()
    return {
        # Same seed, same CPU multinomial on the same probabilities: the draws may coincide exactly.
        "identical_tokens": bool(torch.equal(t_d, t_g)),
        "drlc_mean_logprob": round(row_d.mean().item(), 4),
        "generate_mean_logprob": round(row_g.mean().item(), 4),
        "mean_logprob_z": round(diff / se, 2) if se > 0 else 0.0,
        "drlc_rescore_max_abs_diff": float(f"{(rescore(policy, queries, t_d) - lp_d).abs().max().item():.2e}"),
        "generate_rescore_max_abs_diff": float(f"{(rescore(policy, queries, t_g) - lp_g).abs().max().item():.2e}"),
    }


def bench_shape(name: str, shape: dict, *, batch: int, query_len: int, max_new_tokens: int, repeats: int,
                seed: int = 0) -> dict:
    policy = build_policy(shape, seed)
    queries = make_queries(shape["vocab_size"], batch, query_len, seed)
    samplers = {"drlc": run_drlc, "generate": run_generate}
    # Warm-up (untimed) doubles as the agreement check's samples.
    first = {k: fn(policy, queries, max_new_tokens, seed + 1) for k, fn in samplers.items()}
    produced = {k: list(t.shape) for k, (t, _) in first.items()}
    check = agreement(policy, queries, first["drlc"], first["generate"])
    times = {k: [] for k in samplers}
    for r in range(repeats):
        for k, fn in samplers.items():  # interleaved: drlc, generate, drlc, generate, ...
            started = time.perf_counter()
            tokens, _ = fn(policy, queries, max_new_tokens, seed + 2 + r)
            times[k].append(time.perf_counter() - started)
            assert list(tokens.shape) == [batch, max_new_tokens], (k, tokens.shape)
    new_tokens = batch * max_new_tokens
    med = {k: statistics.median(v) for k, v in times.items()}
    tps = {k: new_tokens / v for k, v in med.items()}
    return {
        "shape": dict(shape), "batch": batch, "query_len": query_len, "max_new_tokens": max_new_tokens,
        "repeats": repeats, "new_tokens_per_call": new_tokens, "produced_shape": produced,
        "seconds": {k: [round(x, 4) for x in v] for k, v in times.items()},
        "median_s": {k: round(v, 4) for k, v in med.items()},
        "tokens_per_s": {k: round(v, 1) for k, v in tps.items()},
        "ratio_drlc_over_generate": round(tps["drlc"] / tps["generate"], 3),
        "agreement": check,
    }


def run_benchmark(shapes: dict[str, dict], *, batch: dict[str, int] | int, query_len: dict[str, int] | int,
                  max_new_tokens: dict[str, int] | int, repeats: int, threads: int = 2) -> dict:
    """batch, query_len and max_new_tokens: one value for every shape, or one per shape name."""
    torch.set_num_threads(threads)
    load_before = os.getloadavg()
    results = {}

    def per_shape(value, name):
        return value[name] if isinstance(value, dict) else value

    for name, shape in shapes.items():
        results[name] = bench_shape(name, shape, batch=per_shape(batch, name), query_len=per_shape(query_len, name),
                                    max_new_tokens=per_shape(max_new_tokens, name), repeats=repeats)
    return {
        "results": results,
        "threads": torch.get_num_threads(),
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
        "init_std": INIT_STD,
        "settings": "temperature 1, top_k 0, top_p 1.0, KV cache, no EOS, behaviour log-probs in fp32",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--query-len", type=int, default=8)
    parser.add_argument("--demo-new-tokens", type=int, default=48)
    parser.add_argument("--small-new-tokens", type=int, default=24)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/sampler_speed.json"))
    args = parser.parse_args()
    long_name = "gpt2_small_long_prompt"
    report = run_benchmark(SHAPES, batch={**dict.fromkeys(SHAPES, args.batch), long_name: LONG_PROMPT["batch"]},
                           query_len={**dict.fromkeys(SHAPES, args.query_len), long_name: LONG_PROMPT["query_len"]},
                           max_new_tokens={"demo": args.demo_new_tokens, "gpt2_small": args.small_new_tokens,
                                           long_name: args.small_new_tokens},
                           repeats=args.repeats)
    Path(args.out).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    for name, r in report["results"].items():
        print(f"{name}: drlc {r['tokens_per_s']['drlc']} tok/s, generate {r['tokens_per_s']['generate']} tok/s, "
              f"ratio {r['ratio_drlc_over_generate']}, agreement {r['agreement']}")
    print(f"threads {report['threads']}, load {report['load_avg_before']} -> {report['load_avg_after']}")


if __name__ == "__main__":
    main()
