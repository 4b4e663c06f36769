"""Span → token alignment: turn the critic's labelled spans into one reward per response token.

Mode ``"exact"`` (the default) finds each span's character occurrences in the response
text and rewards every token whose characters overlap one. Occurrences are searched in
this order, stopping at the first rule that finds any (:func:`find_occurrences`): the
exact text at word boundaries, a tolerant match at word boundaries (case, whitespace runs,
quote and dash styles), the same without punctuation or decoration at the span's edges
(a critic copying "What a mess!" as "What a mess."), then the exact text anywhere and the
tolerant match anywhere (so "bad" prefers the word "Bad" over the inside of "badge").
Every occurrence found by that rule is rewarded.

:func:`match_items` decides, before alignment, which of a parsed answer's items are kept:
an item is dropped, with its reason, when its label has no reward or when none of its
candidate texts is in the response (for summarization, a span that is only in the source
document says so). A token overlapping several matched
occurrences gets the **sum** of their rewards: two spans that both cover a token are two
pieces of evidence about it, and summing keeps each span's contribution visible in the
total (``sum(intrinsic_rewards)`` changes when a span is added).

The character range of each token is taken from the actual ``response_ids`` by decoding
growing prefixes ``ids[:i+1]``, never by re-encoding the text (a sampled sequence is often
not the tokenizer's own encoding of its text). A byte-level token that holds part of a
multi-byte character decodes to U+FFFD; such a token is given the range of the character
it helps to build, so every token of an emoji or an accented letter overlaps it. Special
tokens decode to nothing and get an empty range (never rewarded). If the decoded ids differ
slightly from ``response_text`` (e.g. tokenization-space clean-up), ranges are carried
over by a character diff.

Mode ``"substring"`` reproduces the research code for comparison: a token is rewarded
(summed over spans) when its own decoded, stripped text is a non-empty substring of the
span text, wherever the token is. It rewards "good" in "good but not good" for the span
"not good". The ``spans`` listing is the same in both modes.

Only ``decode(ids, skip_special_tokens=True)`` of the tokenizer is used, so
:func:`load_decoding_tokenizer` reads a saved tokenizer with the ``tokenizers`` library alone
where transformers would decode it the same way (no transformers or torch import: the critique
stage and `drlc view` start in well under a second).
"""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.config import ALIGNMENTS
from pipeline.core.errors import ConfigError, DataError

__all__ = ["MODES", "AlignedSpans", "align_located", "align_spans", "find_occurrences", "load_decoding_tokenizer",
           "match_items", "token_char_ranges"]

MODES = ALIGNMENTS  # exact: the default; substring: the research code's compatibility mode
_REPLACEMENT = "\ufffd"


@dataclass(frozen=True)
class AlignedSpans:
    """The result of aligning critic spans to a response's tokens.

    Attributes:
        intrinsic_rewards: the critic's reward of each response token, ``len == len(response_ids)``
            (stored in the annotations table's ``token_rewards`` column).
        spans: one dict ``{label, text, start, end, reward}`` per matched occurrence
            (character offsets into ``response_text``, end exclusive), or one with
            ``start == end == -1`` for a span that was not found.
    """

    intrinsic_rewards: list[float]
    spans: list[dict]


def align_spans(*, response_text: str, response_ids: list[int], tokenizer, spans, rewards: dict[str, float],
                mode: str = "exact") -> AlignedSpans:
    """Give each response token the rewards of the critic spans that cover it.

    Params:
        response_text: the response as decoded for the critic.
        response_ids: the response token ids the policy sampled.
        tokenizer: a Hugging Face tokenizer or a ``tokenizers.Tokenizer`` (``decode`` is the only method used).
        spans: ``(label, span_text)`` pairs, e.g. ``ParsedAnswer.spans``.
        rewards: reward per label, e.g. ``{"positive": 1.0, "negative": -1.0}``.
        mode: ``"exact"`` (character overlap) or ``"substring"`` (research-code compatible).
    Returns:
        :class:`AlignedSpans`.
    Raises:
        ConfigError: unknown mode, a span label missing from ``rewards``, a non-finite reward.
        DataError: ``response_text`` is not (close to) the decoding of ``response_ids``.
    """
    if mode not in MODES:
        raise ConfigError(f"unknown alignment mode {mode!r}; valid modes: {list(MODES)}")
    spans = [(label, text) for label, text in spans]
    for label, _ in spans:
        if label not in rewards:
            raise ConfigError(f"span label {label!r} has no reward; valid labels: {sorted(rewards)}")
    bad = {label: value for label, value in rewards.items() if not math.isfinite(value)}
    if bad:
        raise ConfigError(f"span rewards must be finite numbers, got {bad}")

    listed: list[dict] = []
    for label, text in spans:
        found = find_occurrences(response_text, text)
        for start, end in found or [(-1, -1)]:
            listed.append({"label": label, "text": text, "start": start, "end": end, "reward": float(rewards[label])})

    if mode == "exact":
        intrinsic_rewards = _overlap_rewards(response_text, response_ids, tokenizer, listed)
    else:
        intrinsic_rewards = _substring_rewards(response_ids, tokenizer, spans, rewards)
    assert len(intrinsic_rewards) == len(response_ids)
    return AlignedSpans(intrinsic_rewards=intrinsic_rewards, spans=listed)


def align_located(*, response_text: str, response_ids: list[int], tokenizer, located, rewards: dict[str, float],
                  mode: str = "exact") -> AlignedSpans:
    """:func:`align_spans` for spans already located: ``(label, start, end)`` character ranges
    (voted spans, :mod:`pipeline.critic.vote`), each rewarded where it is and nowhere else in mode
    ``exact``; mode ``substring`` uses their texts as :func:`align_spans` does.
    """
    if mode not in MODES:
        raise ConfigError(f"unknown alignment mode {mode!r}; valid modes: {list(MODES)}")
    listed = [{"label": label, "text": response_text[start:end], "start": start, "end": end,
               "reward": float(rewards[label])} for label, start, end in located]
    if mode == "exact":
        intrinsic_rewards = _overlap_rewards(response_text, response_ids, tokenizer, listed)
    else:
        intrinsic_rewards = _substring_rewards(response_ids, tokenizer,
                                               [(span["label"], span["text"]) for span in listed], rewards)
    return AlignedSpans(intrinsic_rewards=intrinsic_rewards, spans=listed)


def match_items(items, response_text: str, *, rewards: dict[str, float],
                elsewhere: dict[str, str] | None = None) -> tuple[list[tuple[str, str]], list[dict]]:
    """Split a parsed answer's items into the spans to align and the dropped items.

    Params:
        items: :class:`pipeline.critic.parse.Item` objects (label, text, candidates).
        response_text: the text the spans must be found in.
        rewards: reward per label; an item whose label is not a key is dropped.
        elsewhere: other texts shown to the critic, by name (e.g. ``{"document": ...}``): a
            span found only there is dropped with a reason that names it.
    Returns:
        ``(kept, dropped)``: kept ``(label, text)`` pairs, the text being the first candidate
        found in the response (or, if none is, each comma-separated part that is); dropped ``{label, text, reason}`` dicts, in item order.
    """
    kept, dropped = [], []
    for item in items:
        if item.label not in rewards:
            reason = "no label given" if not item.label else f"label {item.label!r} has no reward"
            dropped.append({"label": item.label, "text": item.text, "reason": reason})
            continue
        candidates = item.candidates or (item.text,)
        found = next((text for text in candidates if find_occurrences(response_text, text)), None)
        if found is not None:
            kept.append((item.label, found))
            continue
        parts = [part for part in item.parts if find_occurrences(response_text, part)]
        if parts:  # "great, fun": a list written without quotes
            kept.extend((item.label, part) for part in parts)
            continue
        where = [name for name, other in (elsewhere or {}).items()
                 if any(find_occurrences(other, text) for text in candidates)]
        reason = "not in the response" + (f" (found only in the {', '.join(where)})" if where else "")
        dropped.append({"label": item.label, "text": item.text, "reason": reason})
    return list(dict.fromkeys(kept)), dropped


def find_occurrences(text: str, span: str) -> list[tuple[int, int]]:
    """Return the ``(start, end)`` character ranges of ``span`` in ``text``.

    Tries, in order, and returns the first non-empty result: the exact span at word
    boundaries; a tolerant match at word boundaries (any case, any whitespace run, optional
    space around punctuation, straight or curly quotes and apostrophes, any dash); the same
    for the span without the punctuation and decoration at its edges (quotes, ``*``, ``.``,
    ``!``, brackets ...: "What a mess." finds "What a mess!"); then the exact span and the
    tolerant edge-trimmed span anywhere, inside words too. Occurrences do not overlap. A blank
    span is never found.
    """
    span = span.strip()
    if not span:
        return []
    core = span.strip(_EDGE) or span  # a span of punctuation only is looked up as it is
    attempts = [
        (_bounded(span, re.escape(span)), 0),
        (_bounded(span, _tolerant(span)), re.IGNORECASE),
        (_bounded(core, _tolerant(core)), re.IGNORECASE),
        (re.escape(span), 0),
        (_tolerant(core), re.IGNORECASE),
    ]
    for pattern, flags in attempts:
        found = [(m.start(), m.end()) for m in re.finditer(pattern, text, flags)]
        if found:
            return found
    return []


_EDGE = " \t\n\"'“”‘’«»„`*_.,;:!?…()[]{}<>-–—~"
_TOKEN = re.compile(r"\w+|[^\w\s]")
_SAME = {"'": "['’‘`]", "’": "['’‘`]", "‘": "['’‘`]", "`": "['’‘`]", '"': "[\"“”„]", "“": "[\"“”„]",
         "”": "[\"“”„]", "-": "[-–—]", "–": "[-–—]", "—": "[-–—]"}


def _tolerant(span: str) -> str:
    """A pattern for ``span`` with any whitespace run between words and optional space at punctuation."""
    tokens = list(_TOKEN.finditer(span))
    parts = []
    for previous, token in zip([None] + tokens, tokens):
        if previous is not None:
            spaced = previous.end() < token.start()
            words = previous.group()[-1].isalnum() and token.group()[0].isalnum()
            parts.append(r"\s+" if spaced and words else "" if words else r"\s*")
        parts.append(_SAME.get(token.group(), re.escape(token.group())))
    return "".join(parts)


def _bounded(span: str, pattern: str) -> str:
    head = r"(?<!\w)" if re.match(r"\w", span) else ""
    tail = r"(?!\w)" if re.search(r"\w$", span) else ""
    return head + pattern + tail


# The classes whose decode is tokenizer.json's own (transformers' TokenizersBackend._decode) when
# clean_up_tokenization_spaces is off: what save_pretrained writes for the demo's BPE and SmolLM2.
_PLAIN_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_decoding_tokenizer(folder: str | Path):
    """The tokenizer saved in `folder` (save_pretrained), for decoding ids: an object with ``decode``.

    A ``tokenizers.Tokenizer`` read from tokenizer.json when transformers would decode exactly as it
    does (tokenizer_class TokenizersBackend or PreTrainedTokenizerFast, no tokenization-space clean-up:
    tests/test_critic_align.py compares the two); else transformers' AutoTokenizer.
    """
    folder = Path(folder)
    config_path, tokenizer_path = folder / "tokenizer_config.json", folder / "tokenizer.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    if (tokenizer_path.is_file() and config.get("tokenizer_class") in _PLAIN_TOKENIZER_CLASSES
            and not config.get("clean_up_tokenization_spaces", False)):
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(tokenizer_path))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def token_char_ranges(tokenizer, response_ids: list[int]) -> tuple[str, list[tuple[int, int]]]:
    """Return the decoded text of ``response_ids`` and each token's character range in it.

    Decodes the prefixes ``ids[:i+1]`` (O(n²) decoding, a few ms for 200 tokens). A prefix
    ending in U+FFFD ends inside a multi-byte character: that character is counted as
    covered by the token but not yet complete, so the next token's range starts on it too.
    """
    ids = list(response_ids)
    full = tokenizer.decode(ids, skip_special_tokens=True)
    ranges = []
    complete = 0  # characters of `full` finished before the current token
    for i in range(len(ids)):
        prefix = tokenizer.decode(ids[: i + 1], skip_special_tokens=True)
        stable = prefix.rstrip(_REPLACEMENT)
        pending = len(stable) < len(prefix)
        stable_len = len(stable) if full.startswith(stable) else _common_prefix_len(stable, full)
        stable_len = max(complete, stable_len)
        end = min(len(full), stable_len + (1 if pending else 0))
        ranges.append((complete, max(complete, end)))
        complete = stable_len
    return full, ranges


def _common_prefix_len(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _position_map(decoded: str, text: str) -> list[int]:
    """Map each position 0..len(decoded) in ``decoded`` to a position in ``text``."""
    if decoded == text:
        return list(range(len(text) + 1))
    matcher = difflib.SequenceMatcher(None, decoded, text, autojunk=False)
    blocks = matcher.get_matching_blocks()
    if sum(block.size for block in blocks) < 0.5 * max(len(decoded), len(text)):
        raise DataError(
            f"response_text {text[:40]!r}... is not the decoding of response_ids ({decoded[:40]!r}...); "
            "pass the text decoded from the same ids"
        )
    mapped = [-1] * (len(decoded) + 1)
    for a, b, size in blocks:
        for k in range(size):
            mapped[a + k] = b + k
    mapped[len(decoded)] = len(text)
    carry = 0  # an unmatched position maps to just after the previous matched character
    for k in range(len(decoded) + 1):
        if mapped[k] == -1:
            mapped[k] = carry
        else:
            carry = mapped[k] + 1 if k < len(decoded) else mapped[k]
    return mapped


def _overlap_rewards(response_text: str, response_ids: list[int], tokenizer, listed: list[dict]) -> list[float]:
    decoded, ranges = token_char_ranges(tokenizer, response_ids)
    position = _position_map(decoded, response_text)
    intrinsic_rewards = [0.0] * len(response_ids)  # (T,)
    for i, (start, end) in enumerate(ranges):
        token_start, token_end = position[start], position[end]
        if token_start == token_end:  # a special token or one that decodes to nothing
            continue
        for span in listed:
            if span["start"] >= 0 and token_start < span["end"] and token_end > span["start"]:
                intrinsic_rewards[i] += span["reward"]
    return intrinsic_rewards


def _substring_rewards(response_ids: list[int], tokenizer, spans, rewards: dict[str, float]) -> list[float]:
    intrinsic_rewards = [0.0] * len(response_ids)  # (T,)
    for i, token_id in enumerate(response_ids):
        piece = tokenizer.decode([token_id], skip_special_tokens=True).strip()
        if not piece:
            continue
        for label, text in spans:
            if piece in text:
                intrinsic_rewards[i] += float(rewards[label])
    return intrinsic_rewards
