"""The real-text study's critics and their measured quality (issue 30): char F1 on the SemEval-2021 trial posts.

Runs the audit behind `drlc critic eval` (the local server, client and cache, as in training) on
all 690 trial posts for the distilled tagger, the random-span control (``critic.backend:
random_spans``, the tagger's span count and lengths at random places) with --random-seeds, and the
lexicon critic with the everything / nothing / word-list baselines. The SmolLM2 critics are not
re-run (3-6 s an answer on two cores): their char F1 on 40 trial posts is read from
benchmarks/results/critic_formats.json and marked as such.

The tagger: --tagger-dir (e.g. critics/semeval from the study profile's distill@semeval stage), or
distilled here from tsd_train.csv with the profile's settings (about 2.5 minutes).

Run: ``flock /tmp/drlc-heavy.lock python benchmarks/study_critics.py [--tagger-dir critics/semeval]``
Writes benchmarks/results/study_critics.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import tempfile
import time
from pathlib import Path

from pipeline.audit.critic_eval import audit_critic
from pipeline.audit.distill import distill, examples_from_file
from pipeline.core.config import load_params
from pipeline.critic.offline.tagger import model_hash

REPO = Path(__file__).resolve().parents[1]

DATA = REPO.parent / "shared" / "data" / "toxicity" / "semeval2021_toxic_spans"
KEPT = ("char_f1", "span_precision", "span_recall", "span_f1", "status_share", "requests_sent", "cache_hits")
PROFILE = REPO / "configs" / "study-detox.yaml"


def smollm2_quality(path: Path) -> dict:
    """SmolLM2's char F1 per answer format from benchmarks/critic_formats.py's result (not re-run here).

    Only the rows of the critic the study runs: drlc's hf backend, one answer per post (the file
    also holds llama.cpp and voting rows).
    """
    result = json.loads(path.read_text())
    return {f"smol_{r['answer_format']}": {"char_f1": r["char_f1"], "n_posts": r["n_posts"],
                                           "source": f"{path.name} (answer_format {r['answer_format']}, "
                                                     f"{r['n_posts']} trial posts, seed {result['settings']['seed']})"}
            for r in result["results"] if r["answer_format"] in ("text", "copy", "copy_words")
            and r.get("endpoint", "hf") == "hf" and r["samples"] == 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tagger-dir", type=Path, default=None, help="a distilled tagger (default: distil one here)")
    parser.add_argument("--random-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "study_critics.json")
    args = parser.parse_args()
    trial, train = DATA / "tsd_trial.csv", DATA / "tsd_train.csv"
    critic = load_params(PROFILE).critic
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        tagger_dir, distilled = args.tagger_dir, None
        if tagger_dir is None:
            tagger_dir = Path(tmp) / "semeval"
            distilled = distill(examples_from_file(train, labels=("toxic",)), labels=("toxic",), out_dir=tagger_dir,
                                source=str(train))
        tagger = dataclasses.replace(critic, backend="tagger", model_dir=str(tagger_dir), model="drlc-tagger",
                                     cache_dir=f"{tmp}/cache", template=str(REPO / critic.template))
        _, audit = audit_critic(spans_path=trial, critic=tagger, train_path=train, progress=False)
        critics = {name: {k: audit["critics"][ref][k] for k in KEPT} | {"n_posts": audit["n_posts"]}
                   for name, ref in (("tagger", "configured"), ("lexicon", "lexicon"), ("everything", "everything"),
                                     ("nothing", "nothing"), ("wordlist", "wordlist"))}
        random_runs = {}
        for seed in args.random_seeds:
            control = dataclasses.replace(tagger, backend="random_spans", model="drlc-random-spans",
                                          extra_body={"drlc_seed": seed})
            _, summary = audit_critic(spans_path=trial, critic=control, references=False, progress=False)
            random_runs[seed] = {k: summary["critics"]["configured"][k] for k in KEPT}
        f1s = [r["char_f1"] for r in random_runs.values()]
        critics["random"] = {"char_f1": sum(f1s) / len(f1s), "char_f1_by_seed": {s: r["char_f1"] for s, r in
                                                                                 random_runs.items()},
                             "n_posts": audit["n_posts"], "runs": random_runs}
        critics |= smollm2_quality(REPO / "benchmarks" / "results" / "critic_formats.json")
        result = {"machine": f"{platform.machine()}, 2 shared CPU cores", "python": platform.python_version(),
                  "trial_file": str(trial.relative_to(REPO.parent)), "profile": str(PROFILE.relative_to(REPO)),
                  "tagger": {"model_hash": model_hash(tagger_dir),
                             "distilled_here": distilled is not None,
                             "heldout_char_f1": (distilled or {}).get("heldout", {}).get("char_f1")},
                  "critics": critics, "wall_s": round(time.perf_counter() - started, 1)}
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({name: round(c["char_f1"], 3) for name, c in critics.items()}))


if __name__ == "__main__":
    main()
