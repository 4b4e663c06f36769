"""Offline toxicity fit to Perspective scores: logistic regression over word n-grams (``score.scorer: fitted``).

RealToxicityPrompts rows carry Perspective API toxicity for their prompt and their
continuation. This scorer learns to predict it offline, so a run without a Perspective key
still gets a reward that was trained on, and is tested against, Perspective's judgement.

Model: toxicity(x) = sigmoid(w . f(x) + b), f(x) = counts of the lower-cased word uni- and
bigrams of x (pipeline/evaluate/naive_bayes.py ``features``) that occur in at least
``min_count`` training texts. Fit: minimise the mean binary cross-entropy against the
Perspective score used as a soft target, plus l2/2 * |w|^2, with L-BFGS in float64.

Held out: the rows of the data are shuffled with a fixed seed (``SPLIT_SEED``) and the last ``HELDOUT_SHARE``
are never trained on; ``heldout`` reports the Spearman correlation with Perspective on their
prompts and on their continuations (the score stage records it in its metrics). Rows, not
texts, are split, so a held-out continuation's prompt was not trained on either.
"""
from __future__ import annotations

import hashlib
import random

import torch

from pipeline.core.errors import DataError
from pipeline.evaluate.naive_bayes import features

HELDOUT_SHARE = 0.2
SPLIT_SEED = 0  # fixed, so runs with different run.seed are scored by the same scorer
PARTS = ("prompt", "continuation")


def rtp_rows(source: str) -> list[dict[str, tuple[str, float]]]:
    """{part: (text, Perspective toxicity)} of each RealToxicityPrompts record of `source`, for the
    parts that have both; records with neither are left out.

    Raises: DataError naming the source when no record has a scored prompt or continuation.
    """
    from pipeline.data.local import field, read_records

    rows = []
    for record in read_records(source):
        row = {part: (field(record, f"{part}.text"), field(record, f"{part}.toxicity")) for part in PARTS}
        row = {part: (text, float(tox)) for part, (text, tox) in row.items() if text and tox is not None}
        if row:
            rows.append(row)
    if not rows:
        raise DataError(f"'score.train_data' = {source!r} has no record with prompt/continuation 'text' and "
                        "'toxicity' (the RealToxicityPrompts format): point it at RTP JSONL files, e.g. "
                        "../shared/data/toxicity/decodingtrust_rtp.")
    return rows


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation (ties get their average rank); nan when either side is constant."""
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    var = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / var if var > 0 else float("nan")


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for i in order[start:end + 1]:
            ranks[i] = (start + end) / 2 + 1
        start = end + 1
    return ranks


class FittedToxicity:
    """toxicity(texts) in (0, 1) from a logistic regression fit with :meth:`fit`."""

    name = "fitted"

    def __init__(self, vocab: dict[str, int], weights: torch.Tensor, bias: float, *, ngram_max: int = 2) -> None:
        self.vocab, self.weights, self.bias, self.ngram_max = vocab, weights, bias, ngram_max
        digest = hashlib.sha256(weights.numpy().tobytes() + repr(bias).encode()).hexdigest()[:12]
        self.version = f"logreg:{len(vocab)}:{digest}"
        self.heldout: dict = {}

    @classmethod
    def fit(cls, texts: list[str], targets: list[float], *, l2: float = 1e-4, min_count: int = 2,
            ngram_max: int = 2, max_iter: int = 100) -> FittedToxicity:
        """Fit to `targets` in [0, 1] (soft labels); n-grams in fewer than `min_count` texts are dropped."""
        counts = [features(text, ngram_max) for text in texts]
        document_frequency: dict[str, int] = {}
        for count in counts:
            for gram in count:
                document_frequency[gram] = document_frequency.get(gram, 0) + 1
        vocab = {g: i for i, g in enumerate(sorted(g for g, n in document_frequency.items() if n >= min_count))}
        x = _matrix(counts, vocab)
        y = torch.tensor(targets, dtype=torch.float64)
        w = torch.zeros(len(vocab), dtype=torch.float64, requires_grad=True)
        b = torch.zeros((), dtype=torch.float64, requires_grad=True)
        optimizer = torch.optim.LBFGS([w, b], max_iter=max_iter, tolerance_grad=1e-9, tolerance_change=1e-12,
                                      history_size=20, line_search_fn="strong_wolfe")

        def loss():
            optimizer.zero_grad()
            logits = torch.sparse.mm(x, w[:, None])[:, 0] + b
            value = torch.nn.functional.binary_cross_entropy_with_logits(logits, y) + 0.5 * l2 * (w * w).sum()
            value.backward()
            return value

        optimizer.step(loss)
        return cls(vocab, w.detach(), float(b.detach()), ngram_max=ngram_max)

    def toxicity(self, texts: list[str]) -> list[float]:
        x = _matrix([features(text, self.ngram_max) for text in texts], self.vocab)
        with torch.no_grad():
            return torch.sigmoid(torch.sparse.mm(x, self.weights[:, None])[:, 0] + self.bias).tolist()


def _matrix(counts: list, vocab: dict[str, int]) -> torch.Tensor:
    """Sparse (texts x vocab) float64 count matrix; n-grams outside `vocab` are ignored."""
    rows, cols, values = [], [], []
    for r, count in enumerate(counts):
        for gram, c in count.items():
            if gram in vocab:
                rows.append(r)
                cols.append(vocab[gram])
                values.append(float(c))
    index = torch.tensor([rows, cols], dtype=torch.long).reshape(2, -1)
    return torch.sparse_coo_tensor(index, torch.tensor(values, dtype=torch.float64), (len(counts), len(vocab)),
                                   check_invariants=True).coalesce()


def split_rows(rows: list, *, seed: int, heldout_share: float = HELDOUT_SHARE) -> tuple[list, list]:
    """(train rows, held-out rows): a seeded shuffle, the last `heldout_share` held out."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    cut = len(rows) - round(heldout_share * len(rows))
    return [rows[i] for i in order[:cut]], [rows[i] for i in order[cut:]]


def fit_rtp(source: str, *, seed: int = SPLIT_SEED, heldout_share: float = HELDOUT_SHARE, **fit_options) -> FittedToxicity:
    """Fit on the train rows of `source` (prompts and continuations) and record the held-out Spearman."""
    train, heldout = split_rows(rtp_rows(source), seed=seed, heldout_share=heldout_share)
    pairs = [row[part] for row in train for part in PARTS if part in row]
    scorer = FittedToxicity.fit([t for t, _ in pairs], [y for _, y in pairs], **fit_options)
    scorer.heldout = {"train_rows": len(train), "heldout_rows": len(heldout)}
    for part in PARTS:
        kept = [row[part] for row in heldout if part in row]
        if len(kept) > 1:
            predicted = scorer.toxicity([t for t, _ in kept])
            scorer.heldout[f"spearman_{part}"] = spearman(predicted, [y for _, y in kept])
    return scorer
