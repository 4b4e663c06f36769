"""Critic audit on SemEval-2021 Task 5 toxic spans: the lexicon critic and the baselines.

Runs ``audit_critic`` (the code behind `drlc critic eval`) with the demo toxicity profile's
critic (the offline lexicon critic through the local server, prompts/toxicity.md) on:

- the whole trial file (690 posts), the word list learnt on the train file (out of sample);
- the whole train file (7,939 posts), the word list learnt on the train file itself
  (in-sample, an optimistic number) and, separately, 5-fold cross-validated (seeded folds:
  learnt on four fifths, scored on the fifth, scores pooled over the five).

Each audit is run twice on one fresh cache; the second run must send 0 requests.
The SmolLM2-135M self-critic is not run here (an hour of CPU): it was measured with
`drlc critic eval` on a seeded 340-post trial sample (docs/critic-eval.md, "Measured"; result in
benchmarks/results/critic_eval_smollm2_trial340.json); its place in this file's results is ``null``.

Run: ``python benchmarks/critic_eval.py [--out benchmarks/results/critic_eval.json]``
(about two minutes on two cores, most of it the 7,939 lexicon requests).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import random
import tempfile
import time
from pathlib import Path

from pipeline.audit.critic_eval import audit_critic
from pipeline.audit.labelled import read_labelled
from pipeline.audit.span_baselines import learn_wordlist, wordlist_spans
from pipeline.audit.span_metrics import score_post, span_precision_recall
from pipeline.core.config import load_params

REPO = Path(__file__).resolve().parents[1]

DATA = Path("/work/shared/data/toxicity/semeval2021_toxic_spans")
KEPT = ("char_f1", "span_precision", "span_recall", "span_f1", "status_share", "absent_span_share",
        "requests_sent", "cache_hits", "cost_usd")


def audit_twice(spans: Path, train: Path, critic) -> dict:
    """Audit, then audit again on the same cache; return the scores and both runs' request counts."""
    started = time.perf_counter()
    _, first = audit_critic(spans_path=spans, critic=critic, train_path=train, progress=False)
    seconds = time.perf_counter() - started
    _, second = audit_critic(spans_path=spans, critic=critic, train_path=train, progress=False)
    return {
        "n_posts": first["n_posts"], "n_posts_with_gold": first["n_posts_with_gold"],
        "wordlist_in_sample": first["wordlist_in_sample"], "seconds_first_run": round(seconds, 2),
        "requests_rerun": sum(c["requests_sent"] for c in second["critics"].values()),
        "critics": {("lexicon" if name == "configured" else name): {k: c[k] for k in KEPT}
                    for name, c in first["critics"].items()},  # the configured critic is the lexicon
    }


def wordlist_cross_validated(posts, *, folds: int = 5, seed: int = 0) -> dict:
    """The word-list baseline scored on each fold after learning on the others (pooled over posts)."""
    order = list(range(len(posts)))
    random.Random(seed).shuffle(order)
    scores = []
    for k in range(folds):
        held = set(order[k::folds])
        words = learn_wordlist([p for i, p in enumerate(posts) if i not in held])
        scores += [score_post(wordlist_spans(posts[i], words), posts[i].spans) for i in sorted(held)]
    return {"folds": folds, "seed": seed, "char_f1": sum(s.char_f1 for s in scores) / len(scores),
            **span_precision_recall(scores)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "critic_eval.json"))
    args = parser.parse_args()
    trial, train = DATA / "tsd_trial.csv", DATA / "tsd_train.csv"
    with tempfile.TemporaryDirectory() as tmp:
        critic = dataclasses.replace(load_params(REPO / "configs" / "demo-toxicity.yaml").critic,
                                     template=str(REPO / "prompts" / "toxicity.md"), cache_dir=tmp)
        results = {
            "trial": audit_twice(trial, train, critic),
            "train_in_sample": audit_twice(train, train, critic),
        }
    results["train_wordlist_5fold"] = wordlist_cross_validated(read_labelled(train, labels=("toxic",)))
    results["smollm2_self_critic"] = None  # measured in a later issue; no number until then
    results["settings"] = {"template": "prompts/toxicity.md", "critic": "local lexicon (configs/demo-toxicity.yaml)",
                           "span_match": "same label and character IoU >= 0.5",
                           "wordlist": "min_count 5, labelled in > 0.5 of occurrences"}
    results["machine"] = {"python": platform.python_version(), "platform": platform.platform()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    for name in ("trial", "train_in_sample"):
        for critic_name, c in results[name]["critics"].items():
            print(f"{name:16s} {critic_name:11s} char F1 {c['char_f1']:.3f}  span P {c['span_precision'] or 0:.3f}"
                  f"  span R {c['span_recall'] or 0:.3f}")
    print(f"train wordlist 5-fold char F1 {results['train_wordlist_5fold']['char_f1']:.3f}; wrote {args.out}")


if __name__ == "__main__":
    main()
