"""The distilled span tagger: train time, time per critiqued response, and its audit on SemEval trial posts.

1. SemEval: `drlc critic distill` on ``tsd_train.csv`` (its own 15% validation split tunes the
   decoding), then the audit behind `drlc critic eval` of the tagger (served by the local
   server, through the client and cache) on the 690 trial posts, beside the lexicon critic
   and the everything / nothing / word-list baselines; a second audit must send 0 requests.
2. Distillation from a critic: the lexicon critic's answers on the train posts (through the
   same audit path) are the training spans; the tagger is then scored against the lexicon
   critic's spans on the trial posts (agreement char F1: how well it imitates the critic).
   This uses SemEval texts, not a demo run's annotations (see the JSON's "note").

Run: ``flock /tmp/drlc-heavy.lock python benchmarks/tagger.py`` (about 6 minutes on two shared cores).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import tempfile
import time
from pathlib import Path

from pipeline.audit.critic_eval import LEXICON, audit_critic
from pipeline.audit.distill import distill, examples_from_file, score_tagger
from pipeline.core.config import load_params
from pipeline.critic.offline.tagger import SpanTagger

REPO = Path(__file__).resolve().parents[1]

DATA = Path("/work/shared/data/toxicity/semeval2021_toxic_spans")
KEPT = ("char_f1", "span_precision", "span_recall", "span_f1", "requests_sent", "cache_hits")


def timed_distill(examples, out_dir, source: str) -> tuple[dict, float]:
    started = time.perf_counter()
    card = distill(examples, labels=("toxic",), out_dir=out_dir, source=source)
    return card, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "tagger.json"))
    args = parser.parse_args()
    trial, train = DATA / "tsd_trial.csv", DATA / "tsd_train.csv"
    base = load_params(REPO / "configs" / "demo-toxicity.yaml").critic
    with tempfile.TemporaryDirectory() as tmp:
        card, train_s = timed_distill(examples_from_file(train, labels=("toxic",)), f"{tmp}/semeval", str(train))
        critic = dataclasses.replace(base, template=str(REPO / "prompts" / "toxicity.md"), backend="tagger",
                                     model_dir=f"{tmp}/semeval", model="drlc-tagger", cache_dir=f"{tmp}/cache")
        started = time.perf_counter()
        _, audit = audit_critic(spans_path=trial, critic=critic, train_path=train, progress=False)
        audit_s = time.perf_counter() - started
        tagger_only = dataclasses.replace(critic, cache_dir=f"{tmp}/cache2")
        started = time.perf_counter()
        _, alone = audit_critic(spans_path=trial, critic=tagger_only, references=False, progress=False)
        serve_s = time.perf_counter() - started
        _, rerun = audit_critic(spans_path=trial, critic=tagger_only, references=False, progress=False)
        tagger = SpanTagger.load(f"{tmp}/semeval")
        texts = [text for text, _ in examples_from_file(trial, labels=("toxic",))]
        started = time.perf_counter()
        for text in texts:
            tagger.spans(text)
        direct_s = time.perf_counter() - started

        lexicon = dataclasses.replace(critic, **LEXICON, cache_dir=f"{tmp}/cache")
        lex_train, _ = audit_critic(spans_path=train, critic=lexicon, references=False, progress=False)
        lex_trial, _ = audit_critic(spans_path=trial, critic=lexicon, references=False, progress=False)

        def spans_of(rows):
            return [(r["text"], tuple((s["label"], s["start"], s["end"]) for s in r["pred_spans"])) for r in rows]

        lex_card, lex_train_s = timed_distill(spans_of(lex_train), f"{tmp}/lexicon", "lexicon critic on tsd_train")
        agreement = score_tagger(SpanTagger.load(f"{tmp}/lexicon"), spans_of(lex_trial))
    result = {
        "machine": f"{platform.machine()}, 2 shared CPU cores", "python": platform.python_version(),
        "semeval": {
            "train_file": str(train), "trial_file": str(trial), "card": card, "train_s": round(train_s, 1),
            "trial_audit": {name: {k: c[k] for k in KEPT} for name, c in audit["critics"].items()},
            "smollm2_hf_char_f1": 0.122,  # benchmarks/results/critic_eval_smollm2_trial340.json (not re-run)
            "trial_posts": len(texts),
            "seconds_per_response_served": round(serve_s / len(texts), 5),
            "seconds_per_response_in_process": round(direct_s / len(texts), 5),
            "requests_on_rerun": rerun["critics"]["configured"]["requests_sent"],
            "tagger_alone_char_f1": alone["critics"]["configured"]["char_f1"],
            "audit_with_references_s": round(audit_s, 1),
        },
        "distilled_from_lexicon": {
            "note": "trained on the lexicon critic's answers to the SemEval train posts (not a demo run's "
                    "annotations); agreement = char F1 of the tagger's spans against the lexicon critic's "
                    "spans on the trial posts",
            "card": lex_card, "train_s": round(lex_train_s, 1), "agreement_on_trial": agreement,
        },
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({"trial_char_f1": result["semeval"]["trial_audit"]["configured"]["char_f1"],
                      "train_s": result["semeval"]["train_s"], "agreement": agreement["char_f1"]}))


if __name__ == "__main__":
    main()
