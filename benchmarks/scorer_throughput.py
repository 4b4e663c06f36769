"""Environment-reward throughput: responses scored per second by each offline scorer.

Texts: each task's own synthetic world (what the demo's policies write): review prefixes
continued by reviews for VADER, generated comments for the toxicity lexicon, corpus
summaries against their documents' reference facts for ROUGE-1. Each scorer is called as the
score stage calls it (pipeline.tasks.<task>.make_reward(...).score, in chunks of 256),
after one warm-up call; the best of --repeats timings is kept. Perspective and HF classifiers
are not measured (network / hub weights).

Usage:  python benchmarks/scorer_throughput.py [--n 20000] [--repeats 3]
Writes benchmarks/results/scorer_throughput.json (sorted keys).
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHUNK = 256


def workloads(n: int) -> dict:
    from pipeline.data.summarization_world import generate_documents, summarization_prompts
    from pipeline.data.toxicity_world import generate_comments
    from pipeline.data.world import generate_reviews

    summaries = [line.split(" TL;DR: ")[1] for line in generate_documents(n, seed=1)]
    references = [p["reference"] for p in summarization_prompts(n, seed=1)]
    return {"sentiment/vader": ("sentiment", "vader", generate_reviews(n, seed=1), None),
            "toxicity/lexicon": ("toxicity", "lexicon", generate_comments(n, seed=1), None),
            "summarization/rouge1": ("summarization", "rouge1", summaries, references)}


def time_scorer(task: str, scorer: str, texts: list[str], references, repeats: int) -> dict:
    from pipeline.core.config import ScoreParams
    from pipeline.tasks import get_task

    reward = get_task(task).make_reward(ScoreParams(scorer=scorer))
    refs = references or [""] * len(texts)
    run = lambda: [v for s in range(0, len(texts), CHUNK)
                   for v in reward.score(texts[s:s + CHUNK], references=refs[s:s + CHUNK])]
    run()  # warm-up (lexicon loading, regex compilation)
    best = min(_seconds(run) for _ in range(repeats))
    return {"responses": len(texts), "seconds": round(best, 4), "responses_per_s": round(len(texts) / best, 1),
            "mean_words": round(sum(len(t.split()) for t in texts) / len(texts), 2)}


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results = {name: time_scorer(*spec, repeats=args.repeats) for name, spec in workloads(args.n).items()}
    out = {"scorers": results, "settings": {"n": args.n, "repeats": args.repeats, "chunk": CHUNK},
           "machine": {"python": platform.python_version(), "cpu": platform.processor()}}
    path = ROOT / "benchmarks" / "results" / "scorer_throughput.json"
    path.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
