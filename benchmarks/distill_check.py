"""Distilled from a critic: a tagger trained on a lexicon-critic demo run's first rounds, scored against
that critic on the next rounds' responses (issue 27, "How it is measured").

The run is the switch-over itself (docs/tagger.md): the demo profile (params.yaml: sentiment, the
lexicon critic on drlc's local server) with `drlc rounds N --switch-after R`, through `dvc repro`
in a fresh copy of the project (tests/e2e.make_project). So `switch_distill@R` trains the tagger on
rounds 1..R's read answers, and `switch_tagger@R` critiques rounds R+1..N with it. Then, for the
responses the tagger critiqued in rounds R+1..N, the lexicon critic's answers are asked through the
critique step (pipeline.steps.critique.critique, a fresh cache) and the two sets of located spans
are compared with `drlc critic eval`'s metrics (pipeline/audit/span_metrics.py), the lexicon's as
gold: mean character F1 (agreement F1), span precision and recall at IoU >= 0.5. Beside it, on the
same responses: the everything / nothing baselines and a word list learnt from rounds 1..R's answers
(pipeline/audit/span_baselines.py).

Run: ``flock /tmp/drlc-heavy.lock python -m benchmarks.distill_check`` from the checkout root (a module, as
it builds the project with tests/e2e.py; the demo as configured: about 2 minutes of `dvc repro` on two
shared cores; ``--tiny`` shrinks it as the tests do; with ``--keep DIR`` a finished project there is
reused and repro_s is DVC's check only). Writes benchmarks/results/distill_check.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import yaml

from pipeline.audit.distill import distill, examples_from_folders
from pipeline.audit.labelled import LabelledPost
from pipeline.audit.span_baselines import everything, learn_wordlist, nothing, wordlist_spans
from pipeline.audit.span_metrics import score_post, span_precision_recall
from pipeline.commands.rounds import set_rounds
from pipeline.core import store
from pipeline.core.config import load_params
from pipeline.critic.offline.tagger import SpanTagger
from pipeline.steps.critique import critique
from tests.e2e import dvc, make_project, tiny_params

REPO = Path(__file__).resolve().parents[1]


def spans_of(row: dict) -> tuple:
    """An annotation row's located spans as (label, start, end)."""
    return tuple(sorted((s["label"], int(s["start"]), int(s["end"])) for s in row["spans"] or [] if s["start"] >= 0))


def agreement(pairs: list[tuple[tuple, tuple]]) -> dict:
    """Mean char F1 and span P/R of predicted spans against the critic's, over (predicted, critic) pairs."""
    scores = [score_post(predicted, gold) for predicted, gold in pairs]
    return {"n": len(scores), "char_f1": sum(s.char_f1 for s in scores) / len(scores), **span_precision_recall(scores)}


def side_rounds(project: Path, side: str) -> list[dict[str, list[dict]]]:
    """Each round of one switch side: {rollouts, scores, annotations: rows} from data/<table>/chunk=<side>/round=N."""
    data = project / "data"
    tables = ("rollouts", "scores", "annotations")
    return [{t: store.read_table(store.chunk_dir(data, t, side) / part.name, t) for t in tables}
            for part in sorted(store.chunk_dir(data, "rollouts", side).glob("round=*"))]


def lexicon_answers(project: Path, params, rounds: list[dict]) -> dict[tuple[int, int], tuple]:
    """{(round, rollout_id): the lexicon critic's spans} on those rounds' responses, asked through the critique step."""
    critic = dataclasses.replace(params.critic, cache_dir=str(project / "cache" / "check"))
    answers = {}
    for tables in rounds:
        rows, _ = critique(tables["rollouts"], tables["scores"], critic=critic, run_id=params.run.run_id,
                           tokenizer_dir=str(project / "models" / "base"), round_=tables["rollouts"][0]["round"],
                           task=params.run.task)
        answers |= {(row["round"], row["rollout_id"]): spans_of(row) for row in rows if row["status"] in ("ok", "none")}
    return answers


def tagger_answers(rounds: list[dict]) -> dict[tuple[int, int], tuple[str, tuple]]:
    """{(round, rollout_id): (response, the tagger's spans)} of the rows the tagger critiqued in the run."""
    found = {}
    for tables in rounds:
        responses = {row["rollout_id"]: row["response"] for row in tables["rollouts"]}
        found |= {(row["round"], row["rollout_id"]): (responses[row["rollout_id"]], spans_of(row))
                  for row in tables["annotations"] if row["status"] in ("ok", "none")}
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--switch-after", type=int, default=2)
    parser.add_argument("--tiny", action="store_true", help="the tests' shrunken demo (tests/e2e.tiny_params)")
    parser.add_argument("--keep", help="build the project in KEEP/project and keep it; a finished one is reused")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "distill_check.json"))
    args = parser.parse_args()
    raw = tiny_params(args.rounds) if args.tiny else yaml.safe_load((REPO / "params.yaml").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(args.keep or tmp)
        home.mkdir(parents=True, exist_ok=True)
        project = home / "project" if (home / "project").is_dir() else make_project(home, raw)
        set_rounds(project / "params.yaml", args.rounds, switch_after=args.switch_after)
        params = load_params(project / "params.yaml")
        started = time.perf_counter()
        dvc(["repro"], project)  # nothing to run in a kept, finished project
        repro_s = time.perf_counter() - started
        key = params.switch_round()
        card = json.loads((project / "models" / f"tagger={key}" / "card.json").read_text())
        labels = tuple(card["labels"])
        train = examples_from_folders(project / "data/rollouts/chunk=critic", project / "data/annotations/chunk=critic",
                                      labels=labels)
        later = side_rounds(project, "tagger")
        tagged, lexicon = tagger_answers(later), lexicon_answers(project, params, later)
        common = sorted(set(tagged) & set(lexicon))
        texts = {k: LabelledPost(line=0, post_id=str(k), text=tagged[k][0], spans=lexicon[k]) for k in common}
        wordlist = learn_wordlist([LabelledPost(line=0, post_id=str(i), text=t, spans=s)
                                   for i, (t, s) in enumerate(train)], min_count=2)
        predictors = {
            "tagger (switch_tagger's answers)": lambda k: tagged[k][1],
            "wordlist learnt from rounds 1..R": lambda k: tuple(wordlist_spans(texts[k], wordlist)),
            "everything": lambda k: tuple(everything(texts[k], labels)),
            "nothing": lambda k: tuple(nothing(texts[k], labels)),
        }
        table = {name: agreement([(predict(k), lexicon[k]) for k in common]) for name, predict in predictors.items()}
        started = time.perf_counter()  # the stage's training again, in this process: time, and the same bytes?
        again = distill(train, labels=labels, out_dir=Path(tmp) / "again", source=card["source"],
                        seed=params.switch[key].seed, heldout_share=params.switch[key].heldout_share)
        train_s = time.perf_counter() - started
        tagger = SpanTagger.load(project / "models" / f"tagger={key}", labels=labels)
        started = time.perf_counter()
        for k in common:
            tagger.spans(tagged[k][0])
        tag_ms = 1000 * (time.perf_counter() - started) / max(1, len(common))
        metrics = {k: json.loads(p.read_text()) for k, p in
                   ((p.stem, p) for p in sorted((project / "metrics" / "critique").glob("chunk=*/round=*.json")))}
    result = {
        "command": " ".join(["python", "-m", "benchmarks.distill_check", *sys.argv[1:]]),
        "machine": f"{platform.processor() or platform.machine()}, shared 2-core CPU",
        "profile": "tests/e2e.tiny_params (shrunken demo)" if args.tiny else "params.yaml (the demo)",
        "rounds": args.rounds, "switch_after": key, "repro_s": round(repro_s, 1),
        "critic": f"{params.critic.model} (backend {params.critic.backend}), threshold {params.critic.threshold}",
        "tagger_card": {k: card[k] for k in ("n_examples", "n_train", "n_heldout", "n_spans", "labels", "heldout",
                                             "n_features", "settings", "data_sha256")},
        "critique_per_round": {k: {m: v[m] for m in ("critiqued", "critic_requests", "cache_hits", "critic_cost_usd")}
                               for k, v in metrics.items()},
        "next_rounds_responses": len(common),
        "tagger_train_s": round(train_s, 2), "tagger_ms_per_response (model only, no server)": round(tag_ms, 3),
        "same_model_bytes_when_retrained": again["model_hash"] == card["model_hash"],
        "agreement_with_lexicon": table,
        "note": ("gold = the lexicon critic's located spans on the responses the tagger critiqued in rounds R+1..N; "
                 "char F1 counts (label, offset) pairs, so a span's label must agree too; span P/R at IoU >= 0.5"),
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"agreement_with_lexicon": table, "tagger_heldout": card["heldout"],
                      "repro_s": result["repro_s"]}, indent=1))


if __name__ == "__main__":
    main()
