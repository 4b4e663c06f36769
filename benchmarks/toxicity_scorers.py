"""How well the offline toxicity scorers track Perspective and human labels.

The fitted scorer (pipeline/rewards/fitted_toxicity.py) is fit at each L2 strength on the
train rows of the RealToxicityPrompts files; both it and the lexicon are then scored on the
same held-out rows (Spearman with Perspective toxicity, prompts and continuations) and on the
two Jigsaw samples' human `toxic` labels (ROC AUC), which neither was fit to.
Run: python benchmarks/toxicity_scorers.py --out benchmarks/results/toxicity_scorers.json
"""
from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

from pipeline.rewards.fitted_toxicity import PARTS, SPLIT_SEED, fit_rtp, rtp_rows, spearman, split_rows
from pipeline.rewards.toxicity import LexiconToxicity

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "toxicity"
JIGSAW = {"jigsaw_detoxify_sample": DATA / "jigsaw_detoxify_sample" / "train.csv",
          "jigsaw_ibm_max_sample": DATA / "jigsaw_ibm_max_sample" / "test_examples.csv"}


def roc_auc(scores: list[float], labels: list[int]) -> float:
    """P(a random positive outscores a random negative), ties counting one half."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    return sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))


def agreement(scorer, heldout: list[dict], jigsaw: dict[str, tuple[list[str], list[int]]]) -> dict:
    out = {}
    for part in PARTS:
        kept = [row[part] for row in heldout if part in row]
        out[f"spearman_{part}"] = spearman(scorer.toxicity([t for t, _ in kept]), [y for _, y in kept])
    for name, (texts, labels) in jigsaw.items():
        out[f"auc_{name}"] = roc_auc(scorer.toxicity(texts), labels)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rtp", default=str(DATA / "decodingtrust_rtp"))
    parser.add_argument("--l2", type=float, nargs="+", default=[1e-5, 1e-4, 1e-3, 1e-2])
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    _, heldout = split_rows(rtp_rows(args.rtp), seed=SPLIT_SEED)
    jigsaw = {}
    for name, path in JIGSAW.items():
        rows = list(csv.DictReader(path.open(encoding="utf-8")))
        jigsaw[name] = ([r["comment_text"] for r in rows], [int(r["toxic"]) for r in rows])
    result = {"heldout_rows": len(heldout), "jigsaw_rows": {k: len(v[1]) for k, v in jigsaw.items()},
              "lexicon": agreement(LexiconToxicity(), heldout, jigsaw), "fitted": {}}
    for l2 in args.l2:
        started = time.perf_counter()
        scorer = fit_rtp(args.rtp, l2=l2)
        result["fitted"][str(l2)] = {"fit_s": time.perf_counter() - started, "vocab": len(scorer.vocab),
                                     **agreement(scorer, heldout, jigsaw)}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
