"""A span tagger: a linear model over token features that predicts labelled character spans.

It is what ``drlc critic distill`` trains (from human-labelled spans or a critic's own answers)
and what the ``tagger`` backend of the local critic server answers with, so a run can critique
with a learnt model instead of a paid critic.

Tokens are runs of word characters (inner apostrophes and ``*`` kept: "don't", "f**k") and
single other non-space characters. Each token gets one class: ``O`` or one of the labels,
the label of a token being the one covering more than half of its characters (training).

Model: multinomial logistic regression, P(class | token) = softmax(W f(token) + b), where f
is a binary vector of features present in at least ``min_count`` training tokens:

- the token lower-cased, its exact form, its shape (``Xxx``, ``xx``, ``d``), prefix and suffix of 3;
- character n-grams (``n_min``..``n_max``) of the lower-cased token in ``<...>``;
- the lower-cased tokens at -2, -1, +1, +2, and the bigrams (-1, 0) and (0, +1).

Fit: minimise the mean cross-entropy over training tokens plus ``l2``/2 |W|², with L-BFGS in
float64 on the CPU from zeros (full batch, no sampling), so the same tokens and settings give
the same weights (the seed only orders the validation split of :mod:`pipeline.audit.distill`).

Decoding: a token is predicted as label L when P(L) is the largest non-O probability and is
at least ``threshold``; a text with no such token but whose best token reaches
``fallback`` gets that one token (most labelled posts have a span, and a post with gold
spans and no prediction scores 0). Predicted tokens of one label merge into one span when
only whitespace separates them.

A model folder holds ``weights.npy`` (classes x features, float64), ``features.json`` (the
feature strings, in column order), ``config.json`` (labels, feature and decoding settings)
and ``card.json`` (what it was trained on and how it scored; written by the distiller).
``model_hash`` is the SHA-256 of the first three files: the tagger's identity in cache keys.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from pipeline.core.errors import CriticError

__all__ = ["MODEL_FILES", "SpanTagger", "TaggerConfig", "model_hash", "tagger_hash", "token_classes", "tokenize"]

MODEL_FILES = ("weights.npy", "features.json", "config.json")
_TOKEN = re.compile(r"\w+(?:['’*]+\w+)*|[^\w\s]")
OUTSIDE = "O"


@dataclass(frozen=True)
class TaggerConfig:
    """The tagger's settings: features, fit and decoding (all saved in config.json)."""

    labels: tuple[str, ...]
    n_min: int = 2
    n_max: int = 5
    min_count: int = 2
    l2: float = 1e-5
    max_iter: int = 100
    threshold: float = 0.5
    fallback: float = 0.0
    version: int = 1
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.labels or len(set(self.labels)) != len(self.labels) or OUTSIDE in self.labels:
            raise CriticError(f"tagger labels {list(self.labels)!r}: give one or more distinct labels, not {OUTSIDE!r}")
        if not 1 <= self.n_min <= self.n_max or self.min_count < 1 or self.l2 < 0 or self.max_iter < 1:
            raise CriticError(f"tagger settings n_min={self.n_min} n_max={self.n_max} min_count={self.min_count} "
                              f"l2={self.l2} max_iter={self.max_iter}: need 1 <= n_min <= n_max, min_count >= 1, "
                              "l2 >= 0, max_iter >= 1")
        if not (0 < self.threshold <= 1 and 0 <= self.fallback <= 1):
            raise CriticError(f"tagger threshold={self.threshold} fallback={self.fallback}: need 0 < threshold <= 1 "
                              "and 0 <= fallback <= 1")


def tokenize(text: str) -> list[tuple[int, int]]:
    """The ``(start, end)`` character ranges of the tokens of ``text``.

    >>> [("you f**k off"[s:e]) for s, e in tokenize("you f**k off")]
    ['you', 'f**k', 'off']
    """
    return [(m.start(), m.end()) for m in _TOKEN.finditer(text)]


def token_classes(tokens: list[tuple[int, int]], spans, labels: tuple[str, ...]) -> list[int]:
    """Each token's class: 0 (O) or 1 + the index of the label covering more than half its characters."""
    covered = {}
    for label, start, end in spans:
        for i in range(start, end):
            covered[i] = label
    classes = []
    for start, end in tokens:
        counts: dict[str, int] = {}
        for i in range(start, end):
            if i in covered:
                counts[covered[i]] = counts.get(covered[i], 0) + 1
        best = max(sorted(counts), key=counts.get) if counts else None
        classes.append(1 + labels.index(best) if best and counts[best] * 2 > end - start else 0)
    return classes


def _shape(word: str) -> str:
    shape = re.sub(r"[A-Z]", "X", re.sub(r"[a-z]", "x", re.sub(r"\d", "d", word)))
    return re.sub(r"(.)\1+", r"\1\1", shape)  # runs longer than 2 collapse: "Xxxxx" -> "Xxx"


def token_features(text: str, tokens: list[tuple[int, int]], config: TaggerConfig) -> list[list[str]]:
    """The feature strings of every token of ``text`` (see the module doc)."""
    words = [text[s:e] for s, e in tokens]
    lower = [w.lower() for w in words]
    padded = ["<s2>", "<s1>", *lower, "</s1>", "</s2>"]
    rows = []
    for i, (word, low) in enumerate(zip(words, lower)):
        k = i + 2
        row = [f"w={low}", f"W={word}", f"shape={_shape(word)}", f"pre={low[:3]}", f"suf={low[-3:]}",
               f"w-2={padded[k - 2]}", f"w-1={padded[k - 1]}", f"w+1={padded[k + 1]}", f"w+2={padded[k + 2]}",
               f"b-1={padded[k - 1]}|{low}", f"b+1={low}|{padded[k + 1]}"]
        marked = f"<{low}>"
        for n in range(config.n_min, config.n_max + 1):
            row += [f"c{n}={marked[j:j + n]}" for j in range(len(marked) - n + 1)]
        rows.append(sorted(set(row)))
    return rows


class SpanTagger:
    """A fitted tagger: ``spans(text)`` -> ``[(label, start, end)]``; :meth:`fit`, :meth:`save`, :meth:`load`."""

    def __init__(self, config: TaggerConfig, features: list[str], weights: np.ndarray) -> None:
        self.config, self.features, self.weights = config, features, weights
        self.index = {name: j for j, name in enumerate(features)}  # column of each feature; the last is the bias

    @classmethod
    def fit(cls, examples, config: TaggerConfig) -> SpanTagger:
        """Fit to ``examples``: ``(text, spans)`` pairs, spans ``(label, start, end)`` with labels in config.labels."""
        import torch

        rows, targets = [], []
        for text, spans in examples:
            tokens = tokenize(text)
            rows += token_features(text, tokens, config)
            targets += token_classes(tokens, spans, config.labels)
        if not rows:
            raise CriticError("tagger: the training texts have no tokens; give it labelled texts")
        counts: dict[str, int] = {}
        for row in rows:
            for name in row:
                counts[name] = counts.get(name, 0) + 1
        features = sorted(name for name, n in counts.items() if n >= config.min_count) + ["bias"]
        index = {name: j for j, name in enumerate(features)}
        x = _design(rows, index)
        y = torch.tensor(targets, dtype=torch.long)
        w = torch.zeros(len(features), 1 + len(config.labels), dtype=torch.float64, requires_grad=True)
        optimizer = torch.optim.LBFGS([w], max_iter=config.max_iter, tolerance_grad=1e-9, tolerance_change=1e-12,
                                      history_size=20, line_search_fn="strong_wolfe")

        def loss():
            optimizer.zero_grad()
            logits = torch.sparse.mm(x, w)  # (tokens, classes)
            value = torch.nn.functional.cross_entropy(logits, y) + 0.5 * config.l2 * (w[:-1] * w[:-1]).sum()
            value.backward()
            return value

        optimizer.step(loss)
        return cls(config, features, w.detach().numpy().T.copy())

    def probabilities(self, text: str) -> tuple[list[tuple[int, int]], np.ndarray]:
        """(tokens, P(class | token) as a tokens x classes array; column 0 is O)."""
        tokens = tokenize(text)
        logits = np.zeros((len(tokens), self.weights.shape[0]))
        bias = self.weights[:, -1]
        for i, row in enumerate(token_features(text, tokens, self.config)):
            columns = [self.index[name] for name in row if name in self.index]
            logits[i] = self.weights[:, columns].sum(axis=1) + bias
        logits -= logits.max(axis=1, keepdims=True) if len(tokens) else 0.0
        probs = np.exp(logits)
        return tokens, probs / probs.sum(axis=1, keepdims=True)

    def spans(self, text: str, *, threshold: float | None = None,
              fallback: float | None = None) -> list[tuple[str, int, int]]:
        """The predicted spans ``(label, start, end)`` of ``text``, in order (decoding as in the module doc)."""
        threshold = self.config.threshold if threshold is None else threshold
        fallback = self.config.fallback if fallback is None else fallback
        tokens, probs = self.probabilities(text)
        if not tokens:
            return []
        best = probs[:, 1:].argmax(axis=1)
        best_p = probs[np.arange(len(tokens)), 1 + best]
        chosen = [i for i in range(len(tokens)) if best_p[i] >= threshold]
        if not chosen and fallback > 0 and best_p.max() >= fallback:
            chosen = [int(best_p.argmax())]
        spans: list[tuple[str, int, int]] = []
        for i in chosen:
            label = self.config.labels[best[i]]
            start, end = tokens[i]
            if spans and spans[-1][0] == label and not text[spans[-1][2]:start].strip():
                spans[-1] = (label, spans[-1][1], end)
            else:
                spans.append((label, start, end))
        return spans

    def save(self, folder: str | Path) -> str:
        """Write the model files into ``folder`` (created); return :func:`model_hash`."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / "weights.npy", np.ascontiguousarray(self.weights, dtype="<f8"), allow_pickle=False)
        (folder / "features.json").write_text(json.dumps(self.features, ensure_ascii=False) + "\n", encoding="utf-8")
        config = asdict(self.config) | {"labels": list(self.config.labels)}
        (folder / "config.json").write_text(json.dumps(config, sort_keys=True, indent=1) + "\n", encoding="utf-8")
        return model_hash(folder)

    @classmethod
    def load(cls, folder: str | Path, *, labels: tuple[str, ...] | None = None) -> SpanTagger:
        """Load a model folder; with ``labels``, check the model predicts exactly those.

        :raises CriticError: (one line, naming the folder and the labels expected) a missing
            folder or file, an unreadable file, or other labels
        """
        folder = Path(folder)
        wanted = f"a tagger for labels {list(labels)}" if labels else "a tagger"
        hint = f"expected {wanted} written by `drlc critic distill`"
        missing = [name for name in MODEL_FILES if not (folder / name).is_file()]
        if missing:
            raise CriticError(f"critic.model_dir '{folder}' has no tagger model ({', '.join(missing)} missing); {hint}")
        try:
            config_dict = json.loads((folder / "config.json").read_text(encoding="utf-8"))
            config = TaggerConfig(**{**config_dict, "labels": tuple(config_dict["labels"])})
            features = json.loads((folder / "features.json").read_text(encoding="utf-8"))
            weights = np.load(folder / "weights.npy", allow_pickle=False)
        except (OSError, ValueError, TypeError, KeyError) as error:
            raise CriticError(f"critic.model_dir '{folder}' holds an unreadable tagger ({error}); {hint}") from None
        if weights.shape != (1 + len(config.labels), len(features)):
            raise CriticError(f"critic.model_dir '{folder}': weights.npy has shape {weights.shape}, not "
                              f"{(1 + len(config.labels), len(features))}; {hint}")
        if labels is not None and tuple(labels) != config.labels:
            raise CriticError(f"critic.model_dir '{folder}' tags labels {list(config.labels)}, but the template "
                              f"asks for {list(labels)}; {hint}")
        return cls(config, features, weights)


def _design(rows: list[list[str]], index: dict[str, int]):
    """Sparse (tokens x features) float64 0/1 matrix with the bias column set; features outside index ignored."""
    import torch

    bias = index["bias"]
    r, c = [], []
    for i, row in enumerate(rows):
        columns = [index[name] for name in row if name in index] + [bias]
        r += [i] * len(columns)
        c += columns
    values = torch.ones(len(r), dtype=torch.float64)
    return torch.sparse_coo_tensor(torch.tensor([r, c], dtype=torch.long), values, (len(rows), len(index)),
                                   check_invariants=True).coalesce()


def model_hash(folder: str | Path) -> str:
    """SHA-256 over the model files' bytes (name and content, in MODEL_FILES order), hex."""
    digest = hashlib.sha256()
    for name in MODEL_FILES:
        digest.update(name.encode() + b"\0" + (Path(folder) / name).read_bytes() + b"\0")
    return digest.hexdigest()


def tagger_hash(model_dir: str | Path | None) -> str:
    """:func:`model_hash` of a tagger folder named by critic.model_dir, checked first.

    :raises CriticError: (one line) model_dir is unset or lacks a model file
    """
    if not model_dir:
        raise CriticError("critic.backend 'tagger' (or 'random_spans') needs critic.model_dir: a folder written "
                          "by `drlc critic distill`")
    missing = [name for name in MODEL_FILES if not (Path(model_dir) / name).is_file()]
    if missing:
        raise CriticError(f"critic.model_dir '{model_dir}' has no tagger model ({', '.join(missing)} missing); "
                          "train one with `drlc critic distill --out DIR` and point critic.model_dir at DIR")
    return model_hash(model_dir)
