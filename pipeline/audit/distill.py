"""`drlc critic distill`: train a span tagger from labelled spans or from a critic's own answers.

Two sources of ``(text, spans)`` examples:

- a labelled span file, SemEval ``.csv`` or drlc ``.jsonl``, read exactly as `drlc critic eval
  --spans` reads it (:func:`pipeline.audit.labelled.read_labelled`);
- a run's annotations: every critiqued response whose critic answer was read (status ``ok``:
  its located spans; ``none``: no span), joined to its rollout for the text, or the rows of
  a DuckDB query over the run's tables returning columns ``text`` and ``spans`` (a list of
  ``{label, start, end}``; spans with ``start < 0``, which the aligner could not find, are left out).

The examples are split with a seeded shuffle: the last ``heldout_share`` are held out. The
tagger (:mod:`pipeline.critic.offline.tagger`) is fitted on the rest; its decoding threshold
and fallback are tuned on the held-out examples (a small grid, best mean character F1), which
then give the card's held-out scores. The model folder gets the model files and ``card.json``:
the source, the training data's SHA-256 and size, the labels, the settings, the held-out
scores and the model hash. Same examples, settings and seed give the same folder, byte for byte.
"""
from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from pipeline.audit.labelled import read_labelled
from pipeline.audit.span_metrics import score_post, span_precision_recall
from pipeline.core.errors import ConfigError, DataError
from pipeline.critic.offline.tagger import SpanTagger, TaggerConfig

__all__ = [
    "FALLBACKS",
    "RUN_QUERY",
    "THRESHOLDS",
    "data_sha256",
    "distill",
    "examples_from_file",
    "examples_from_folders",
    "examples_from_run",
    "score_tagger",
    "split_examples",
]

# every read critic answer of a run, with its response text: the default query over a run's tables
RUN_QUERY = ("SELECT r.response AS text, a.spans AS spans FROM annotations a "
             "JOIN rollouts r ON a.round = r.round AND a.rollout_id = r.rollout_id "
             "WHERE a.status IN ('ok', 'none') ORDER BY a.round, a.rollout_id")
THRESHOLDS = (0.2, 0.3, 0.4, 0.5, 0.6)
FALLBACKS = (0.0, 0.02, 0.05, 0.1, 0.2)


def examples_from_file(path: str | Path, *, labels: tuple[str, ...]) -> list[tuple[str, tuple]]:
    """``(text, spans)`` of every post of a labelled span file (raises DataError as read_labelled)."""
    return [(post.text, post.spans) for post in read_labelled(path, labels=labels)]


def examples_from_run(data_dir: str | Path, *, labels: tuple[str, ...], query: str | None = None) -> list:
    """``(text, spans)`` of a run's read critic answers (``query``: a DuckDB query with text, spans).

    :raises DataError: no tables under data_dir, a failing query, missing columns, a label
        outside ``labels`` or no rows
    """
    import duckdb

    from pipeline.core.store import connect

    if not any(Path(data_dir, table).is_dir() for table in ("annotations", "rollouts")):
        raise DataError(f"'{data_dir}' holds no annotations or rollouts table; pass a run's data folder "
                        "(e.g. runs/demo/data) or use --spans FILE")
    try:
        result = connect(data_dir).sql(query or RUN_QUERY)
    except duckdb.Error as error:
        raise DataError(f"distill query failed: {str(error).splitlines()[0]}") from None
    missing = [c for c in ("text", "spans") if result is None or c not in result.columns]
    if missing:
        raise DataError(f"distill query returns no column(s) {missing}; select the response as text and its "
                        "annotation spans as spans")
    return _examples(result.fetchall(), labels=labels, where=f"under '{data_dir}' (the query returned no rows); "
                     "run rounds with the critic on, or check --query")


def examples_from_folders(rollouts_dir: str | Path, annotations_dir: str | Path, *, labels: tuple[str, ...]) -> list:
    """:func:`examples_from_run`'s examples (RUN_QUERY) from the partitions under two folders only.

    The switch-over's tagger stage reads rounds 1..R this way, from the folders one stage wrote
    (data/rollouts/chunk=critic, data/annotations/chunk=critic), which are its DVC deps.

    :raises DataError: a folder without a partition, a label outside ``labels`` or no read answer
    """
    import duckdb

    con = duckdb.connect()
    for table, folder in (("rollouts", rollouts_dir), ("annotations", annotations_dir)):
        files = sorted(Path(folder).glob("**/part-0.parquet"))
        if not files:
            raise DataError(f"'{folder}' holds no {table} partition (round=NNNN/part-0.parquet): run the stage "
                            "that writes it first (dvc repro)")
        con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet({[f.as_posix() for f in files]!r}, "
                    "union_by_name = true, hive_partitioning = false)")
    return _examples(con.sql(RUN_QUERY).fetchall(), labels=labels,
                     where=f"in '{annotations_dir}': every critique there failed, or the critic was off")


def _examples(rows, *, labels: tuple[str, ...], where: str) -> list:
    """``(text, spans)`` of (text, spans) result rows: located spans only (start >= 0), deduplicated, sorted."""
    examples = []
    for text, spans in rows:
        kept = []
        for span in spans or []:
            if span["start"] < 0:
                continue
            if span["label"] not in labels:
                raise DataError(f"distill: span label {span['label']!r} is not a template label; valid: {list(labels)}")
            kept.append((span["label"], int(span["start"]), int(span["end"])))
        examples.append((text, tuple(sorted(set(kept)))))
    if not examples:
        raise DataError(f"distill: no critiqued response with a read answer {where}")
    return examples


def data_sha256(examples) -> str:
    """SHA-256 of the examples as canonical JSON lines (text, sorted spans), in their order."""
    digest = hashlib.sha256()
    for text, spans in examples:
        line = json.dumps([text, sorted(list(s) for s in spans)], ensure_ascii=False, separators=(",", ":"))
        digest.update(line.encode("utf-8") + b"\n")
    return digest.hexdigest()


def split_examples(examples: list, *, seed: int, heldout_share: float) -> tuple[list, list]:
    """(train, held out): a seeded shuffle, the last ``heldout_share`` held out (at least one each)."""
    if not 0 < heldout_share < 1:
        raise ConfigError(f"--heldout-share {heldout_share}: the held-out share must be in (0, 1)")
    if len(examples) < 2:
        raise DataError(f"distill needs at least 2 examples to hold one out; got {len(examples)}")
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    cut = min(len(examples) - 1, max(1, len(examples) - round(heldout_share * len(examples))))
    return [examples[i] for i in order[:cut]], [examples[i] for i in order[cut:]]


def score_tagger(tagger: SpanTagger, examples, *, threshold: float | None = None,
                 fallback: float | None = None) -> dict:
    """Mean character F1 and span precision/recall of the tagger's spans on ``examples``."""
    scores = [score_post(tagger.spans(text, threshold=threshold, fallback=fallback), spans)
              for text, spans in examples]
    return {"n": len(scores), "char_f1": sum(s.char_f1 for s in scores) / len(scores),
            **span_precision_recall(scores)}


def _tune(tagger: SpanTagger, heldout) -> tuple[float, float, dict]:
    """The (threshold, fallback) of the grid with the best held-out char F1 (first on ties), and its scores."""
    best = None
    for threshold in THRESHOLDS:
        for fallback in FALLBACKS:
            if fallback >= threshold:
                continue
            scores = score_tagger(tagger, heldout, threshold=threshold, fallback=fallback)
            if best is None or scores["char_f1"] > best[2]["char_f1"]:
                best = (threshold, fallback, scores)
    return best


def distill(examples: list, *, labels: tuple[str, ...], out_dir: str | Path, source: str, seed: int = 0,
            heldout_share: float = 0.15, **settings) -> dict:
    """Fit a tagger on ``examples``, tune its decoding on the held-out split, write the model folder.

    :param examples: ``(text, spans)`` pairs
    :param labels: the template's labels (the tagger's classes)
    :param out_dir: the model folder to write (created; existing model files are replaced)
    :param source: where the examples came from, for the card
    :param seed: the split's seed
    :param heldout_share: share of examples held out for tuning and the card's scores
    :param settings: other :class:`~pipeline.critic.offline.tagger.TaggerConfig` fields
    :return: the card
    """
    train, heldout = split_examples(examples, seed=seed, heldout_share=heldout_share)
    tagger = SpanTagger.fit(train, TaggerConfig(labels=tuple(labels), **settings))
    threshold, fallback, scores = _tune(tagger, heldout)
    tagger = SpanTagger(TaggerConfig(**{**tagger.config.__dict__, "threshold": threshold, "fallback": fallback}),
                        tagger.features, tagger.weights)
    model = tagger.save(out_dir)
    card = {
        "kind": "drlc span tagger", "source": source, "data_sha256": data_sha256(examples),
        "n_examples": len(examples), "n_train": len(train), "n_heldout": len(heldout),
        "n_spans": sum(len(spans) for _, spans in examples), "labels": list(labels), "seed": seed,
        "heldout_share": heldout_share, "n_features": len(tagger.features),
        "settings": {k: v for k, v in tagger.config.__dict__.items() if k != "labels"},
        "heldout": scores, "model_hash": model,
    }
    (Path(out_dir) / "card.json").write_text(json.dumps(card, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return card
