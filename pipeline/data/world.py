"""The synthetic review world: a seeded generator of short English movie reviews.

The offline demo needs text that a tiny GPT-2 can learn in about a minute on a CPU, whose
sentiment a lexicon scorer (VADER) reads reliably, and whose grammaticality can be checked
exactly. This module is that world.

Grammar
-------
A review is 1-3 sentences joined by single spaces. A sentence is one of the 16 templates in
``TEMPLATES``; each template is a sequence of literal words, word classes (upper case) and
optional groups ``[...]``. ``ADJP`` abbreviates ``[NOT] [INTENS] ADJ``. A sentence ends with
``END`` (``.`` or ``!``); its first word is capitalised, ``I`` is always upper case, every other
word is lower case, and ``,``/``.``/``!`` stick to the word before them. The word classes:

- ``ADJ``: positive and negative adjectives that are in VADER's lexicon, plus neutral ones
  that are not; ``VERB``: past-tense transitive verbs of both signs plus neutral ones;
  ``FEELING``: feelings of both signs (all in the lexicon);
- ``NOUN`` (things a review talks about: plot, acting, ending, soundtrack, ...), ``MEDIUM``
  (movie, film, picture, show), ``DET`` (the, this), ``OPENER`` (overall, frankly, ...);
- ``NOT`` (not, never) and ``INTENS`` (VADER booster words: very, really, extremely, ...).
  "truly" and "honestly" are left out on purpose: VADER scores them as positive words, so
  they would tilt sentences that are meant to be neutral.

Polarity is a *generation* choice, not part of the grammar: a sentence is written with a
target polarity (positive, negative or neutral), negation flips the word that follows it,
and "but"/"although" templates give their first clause the opposite polarity. A review is
positive, negative or mixed with probability 1/3 each, so a policy trained on VADER has room
to become more positive. ``is_grammatical`` ignores polarity: "I loved the awful plot." is
grammatical.

What the world can and cannot show
----------------------------------
It can show a policy drifting towards positive words, and degrading (leaving the grammar,
measured exactly by ``is_grammatical``). It cannot show anything about long-range coherence,
factual content, rare words or subword morphology: the vocabulary is about 230 word types
and every sentence is a template. Sentiment here is lexical, so it is exactly what VADER
measures; a critic that finds "bad spans" is finding negative adjectives, verbs and feelings.
"""

from __future__ import annotations

import itertools
import random
import re
from functools import lru_cache

from pipeline.core.errors import ConfigError

POSITIVE_ADJECTIVES = (
    "good", "great", "wonderful", "brilliant", "superb", "excellent", "amazing", "fantastic",
    "lovely", "beautiful", "charming", "delightful", "enjoyable", "fun", "funny", "clever",
    "fresh", "perfect", "awesome", "terrific", "outstanding", "marvelous", "splendid",
    "gorgeous", "elegant", "powerful", "inspiring", "impressive", "entertaining", "pleasant",
    "sweet", "smart", "exciting", "thrilling", "engaging", "stunning", "magnificent", "solid",
    "strong", "nice", "cool", "hilarious", "fabulous", "glorious", "graceful",
)
NEGATIVE_ADJECTIVES = (
    "bad", "terrible", "awful", "boring", "dull", "horrible", "weak", "poor", "stupid", "ugly",
    "disappointing", "painful", "annoying", "lame", "pathetic", "dreadful", "miserable",
    "horrid", "messy", "worthless", "confusing", "irritating", "frustrating", "depressing",
    "offensive", "ridiculous", "lousy", "inferior", "unpleasant", "tragic", "disastrous",
    "cruel", "dumb", "awkward",
)
NEUTRAL_ADJECTIVES = (
    "long", "short", "slow", "quiet", "loud", "simple", "familiar", "dark", "unusual",
    "ordinary", "average", "standard", "typical", "quick", "old", "new", "modern", "classic",
    "subtle", "plain", "heavy", "light", "brief", "colorful",
)
POSITIVE_VERBS = (
    "loved", "enjoyed", "liked", "adored", "admired", "appreciated", "praised", "cherished",
    "treasured", "celebrated", "welcomed", "applauded",
)
NEGATIVE_VERBS = (
    "hated", "disliked", "despised", "loathed", "resented", "regretted", "dreaded", "mocked",
    "abhorred",
)
NEUTRAL_VERBS = ("watched", "saw", "noticed", "remembered", "expected", "followed", "reviewed")
POSITIVE_FEELINGS = (
    "happy", "excited", "hopeful", "inspired", "cheerful", "joyful", "relaxed", "proud",
    "glad", "thrilled",
)
NEGATIVE_FEELINGS = (
    "sad", "bored", "angry", "confused", "tired", "uneasy", "lonely", "nervous", "upset",
)

WORD_CLASSES: dict[str, tuple[str, ...]] = {
    "ADJ": POSITIVE_ADJECTIVES + NEGATIVE_ADJECTIVES + NEUTRAL_ADJECTIVES,
    "VERB": POSITIVE_VERBS + NEGATIVE_VERBS + NEUTRAL_VERBS,
    "FEELING": POSITIVE_FEELINGS + NEGATIVE_FEELINGS,
    "NOUN": (
        "movie", "film", "plot", "story", "script", "ending", "opening", "soundtrack", "score",
        "dialogue", "acting", "cast", "direction", "cinematography", "pacing", "editing",
        "music", "lighting", "camera", "setting", "premise", "finale", "actor", "actress",
        "director", "writer", "lead", "sequel", "twist", "climax", "scene", "performance",
        "screenplay", "narration", "atmosphere", "tone", "production", "design", "makeup",
        "costume", "character", "chemistry", "sound", "runtime", "trailer", "drama", "mystery",
    ),
    "MEDIUM": ("movie", "film", "picture", "show"),
    "DET": ("the", "this"),
    "OPENER": ("overall", "frankly", "admittedly", "ultimately", "personally", "generally"),
    "NOT": ("not", "never"),
    "INTENS": ("very", "really", "extremely", "incredibly", "absolutely", "quite", "remarkably"),
    "END": (".", "!"),
}
POLAR_CLASSES = {
    "ADJ": (POSITIVE_ADJECTIVES, NEGATIVE_ADJECTIVES, NEUTRAL_ADJECTIVES),
    "VERB": (POSITIVE_VERBS, NEGATIVE_VERBS, NEUTRAL_VERBS),
    "FEELING": (POSITIVE_FEELINGS, NEGATIVE_FEELINGS, ()),
}

# (pattern, kind): kind "contrast" gives the first polar word the opposite polarity;
# "fixed" means the template's only polar word is the literal "recommend", so "[not]"
# is decided by the target polarity and the template cannot be neutral.
TEMPLATES: tuple[tuple[str, str], ...] = (
    ("DET NOUN was ADJP END", "plain"),
    ("I thought the NOUN was ADJP END", "plain"),
    ("The NOUN in this MEDIUM was ADJP END", "plain"),
    ("I [never] [INTENS] VERB DET NOUN END", "plain"),
    ("OPENER , DET NOUN was ADJP END", "plain"),
    ("DET NOUN was ADJP , but DET NOUN was ADJP END", "contrast"),
    ("DET NOUN was ADJP and DET NOUN was ADJP END", "plain"),
    ("DET NOUN felt ADJP END", "plain"),
    ("It was ADJP from start to finish END", "plain"),
    ("I found DET NOUN ADJP END", "plain"),
    ("Although DET NOUN was ADJP , DET NOUN was ADJP END", "contrast"),
    ("DET NOUN is ADJP END", "plain"),
    ("DET NOUN and DET NOUN were ADJP END", "plain"),
    ("I would [not] recommend this MEDIUM to anyone END", "fixed"),
    ("Watching this MEDIUM was ADJP END", "plain"),
    ("DET NOUN made me feel [INTENS] FEELING END", "plain"),
)
_MACROS = {"ADJP": "[NOT] [INTENS] ADJ"}
_PUNCTUATION = (",", ".", "!")
_OPTIONAL_PROBABILITY = {"NOT": 0.2, "never": 0.2, "INTENS": 0.35}
POSITIVE, NEGATIVE, NEUTRAL = "positive", "negative", "neutral"


def _items(pattern: str) -> list[tuple[str, ...]]:
    """Split a template into items: a 1-tuple is required, a longer tuple is ("?", *group)."""
    for name, expansion in _MACROS.items():
        pattern = re.sub(rf"\b{name}\b", expansion, pattern)
    items: list[tuple[str, ...]] = []
    for group, word in re.findall(r"\[([^\]]+)\]|(\S+)", pattern):
        items.append(("?", *group.split()) if group else (word,))
    return items


def _capitalise(word: str) -> str:
    return word[:1].upper() + word[1:]


def _opposite(polarity: str) -> str:
    return {POSITIVE: NEGATIVE, NEGATIVE: POSITIVE, NEUTRAL: NEUTRAL}[polarity]


def _word_for(symbol: str, polarity: str, rng: random.Random) -> str:
    if symbol in POLAR_CLASSES:
        positive, negative, neutral = POLAR_CLASSES[symbol]
        return rng.choice({POSITIVE: positive, NEGATIVE: negative, NEUTRAL: neutral}[polarity])
    if symbol in WORD_CLASSES:
        return rng.choice(WORD_CLASSES[symbol])
    return symbol


def _sentence(pattern: str, kind: str, polarity: str, rng: random.Random) -> str:
    """Fill one template so that its polar words carry ``polarity`` (see module docstring)."""
    target = _opposite(polarity) if kind == "contrast" else polarity
    words: list[str] = []
    negated = False
    for item in _items(pattern):
        if item[0] == "?":
            group = item[1:]
            is_negation = group[0] in ("NOT", "never", "not")
            if kind == "fixed" and is_negation:
                include = target == NEGATIVE
            elif is_negation:
                include = target != NEUTRAL and rng.random() < _OPTIONAL_PROBABILITY[group[0]]
            else:
                include = rng.random() < _OPTIONAL_PROBABILITY.get(group[0], 0.3)
            if include:
                words.extend(_word_for(symbol, target, rng) for symbol in group)
                negated = negated or is_negation
            continue
        symbol = item[0]
        if symbol in POLAR_CLASSES:
            words.append(_word_for(symbol, _opposite(target) if negated else target, rng))
            negated, target = False, polarity
        elif symbol == "END":
            words.append("!" if polarity != NEUTRAL and rng.random() < 0.1 else ".")
        else:
            words.append(_word_for(symbol, target, rng))
    words[0] = _capitalise(words[0])
    return re.sub(r" ([,.!])", r"\1", " ".join(words))


def _review(rng: random.Random) -> str:
    return _review_with_tone(rng)[0]


def _review_with_tone(rng: random.Random) -> tuple[str, str]:
    tone = rng.choice((POSITIVE, NEGATIVE, "mixed"))
    sentences = []
    for _ in range(rng.randint(1, 3)):
        if tone == "mixed":
            polarity = rng.choice((POSITIVE, NEGATIVE, NEUTRAL))
        else:
            polarity = tone if rng.random() < 0.8 else NEUTRAL
        allowed = [t for t in TEMPLATES if polarity != NEUTRAL or t[1] != "fixed"]
        if polarity == NEUTRAL:
            allowed = [t for t in allowed if "FEELING" not in t[0]]
        pattern, kind = rng.choice(allowed)
        sentences.append(_sentence(pattern, kind, polarity, rng))
    return " ".join(sentences), tone


def generate_reviews(n: int, *, seed: int) -> list[str]:
    """Generate ``n`` reviews of the synthetic world.

    Pure and deterministic: the same ``n`` and ``seed`` give the same list, and the first
    ``m`` reviews of a longer list equal ``generate_reviews(m, seed=seed)``.

    Params: n: number of reviews (>= 0); seed: integer seed of a private ``random.Random``.
    Returns: a list of ``n`` reviews, each 1-3 sentences.
    Raises: ConfigError if ``n`` is negative.
    """
    if n < 0:
        raise ConfigError(f"number of reviews must be >= 0, got n={n}; pass a count such as 20000")
    rng = random.Random(seed)
    return [_review(rng) for _ in range(n)]


def generate_labelled_reviews(n: int, *, seed: int) -> list[tuple[str, int]]:
    """Generate ``n`` reviews with their tone as a label, to train an evaluation classifier.

    A review's label is the tone it was written with: 1 = positive, 0 = negative. Mixed
    reviews (a third of the draws) are skipped rather than labelled by majority, because their
    sentence polarities are drawn independently and often tie. Positive and negative reviews
    can still hold neutral sentences and "but"/"although" clauses of the other sign. The seed
    stream is separate from ``generate_reviews`` and ``review_prefixes``; the first ``m``
    pairs of a longer list equal ``generate_labelled_reviews(m, seed=seed)``.

    Params: n: number of labelled reviews (>= 0); seed: integer seed.
    Returns: a list of ``n`` (review, label) pairs.
    Raises: ConfigError if ``n`` is negative.
    """
    if n < 0:
        raise ConfigError(f"number of labelled reviews must be >= 0, got n={n}; pass a count such as 4000")
    rng = random.Random(f"drlc-labelled-reviews:{seed}")
    pairs: list[tuple[str, int]] = []
    while len(pairs) < n:
        text, tone = _review_with_tone(rng)
        if tone != "mixed":
            pairs.append((text, int(tone == POSITIVE)))
    return pairs


def _first_polar_word(words: list[str]) -> int:
    """Index of the first word that VADER-style sentiment rests on (polar class or "recommend")."""
    polar = {w for classes in POLAR_CLASSES.values() for group in classes[:2] for w in group}
    polar.add("recommend")
    for index, word in enumerate(words):
        if word.strip(",.!").lower() in polar:
            return index
    return len(words)


def review_prefixes(n: int, *, seed: int, min_words: int = 2, max_words: int = 5) -> list[str]:
    """Openings of fresh reviews, used as PPO queries.

    Each prefix is the first k words (k uniform in [min_words, max_words]) of a review drawn
    from a seed stream separate from ``generate_reviews``. k is then shortened to stop before
    the review's first sentiment-bearing word, but never below ``min_words``, so most queries
    are neutral openings ("I thought the", "The acting in this") and the sentiment is left to
    the policy. Words are space-separated; punctuation stays attached ("Overall, the").

    Params: n: number of prefixes; seed: integer seed; min_words, max_words: bounds on k.
    Returns: a list of ``n`` prefixes without trailing space.
    Raises: ConfigError if n < 0 or the bounds are not 1 <= min_words <= max_words.
    """
    if n < 0:
        raise ConfigError(f"number of prefixes must be >= 0, got n={n}; pass a count such as 256")
    if not 1 <= min_words <= max_words:
        raise ConfigError(
            f"prefix length bounds must satisfy 1 <= min_words <= max_words, got "
            f"min_words={min_words}, max_words={max_words}; try min_words=2, max_words=5"
        )
    rng = random.Random(f"drlc-review-prefixes:{seed}")
    prefixes = []
    for _ in range(n):
        words = _review(rng).split(" ")
        k = rng.randint(min_words, max_words)
        k = max(min_words, min(k, _first_polar_word(words)))
        prefixes.append(" ".join(words[:k]))
    return prefixes


@lru_cache(maxsize=1)
def _sentence_trie() -> dict:
    """A trie over every symbol sequence a template can produce; key None marks an end."""
    root: dict = {}
    for pattern, _ in TEMPLATES:
        items = _items(pattern)
        optional = [i for i, item in enumerate(items) if item[0] == "?"]
        for choice in itertools.product((False, True), repeat=len(optional)):
            included = dict(zip(optional, choice))
            node = root
            for index, item in enumerate(items):
                symbols = item[1:] if item[0] == "?" else item
                if item[0] == "?" and not included[index]:
                    continue
                for symbol in symbols:
                    node = node.setdefault(symbol, {})
            node[None] = {}
    return root


def _surfaces(symbol: str, initial: bool) -> tuple[str, ...]:
    words = WORD_CLASSES.get(symbol, (symbol,))
    return tuple(_capitalise(w) for w in words) if initial else words


def _advance(nodes: list[dict], token: str, initial: bool) -> list[dict]:
    return [
        child
        for node in nodes
        for symbol, child in node.items()
        if symbol is not None and token in _surfaces(symbol, initial)
    ]


def is_grammatical(text: str) -> bool:
    """Whether ``text`` is a prefix of a sequence of sentences the grammar produces.

    Exact for the grammar (see module docstring): the text must be complete sentences
    separated by single spaces, optionally followed by an unfinished sentence that may stop
    anywhere, even mid-word or after a trailing space. Any number of sentences is accepted;
    polarity is ignored. The empty string is the empty prefix and counts as grammatical.

    Params: text: the text to check, e.g. a query followed by a sampled continuation.
    Returns: True if some grammatical text starts with ``text``.
    """
    root = _sentence_trie()
    nodes, initial = [root], True
    parts = text.split(" ")
    for position, part in enumerate(parts):
        last = position == len(parts) - 1
        if part == "":
            if last and position > 0:
                return True
            return text == ""
        match = re.fullmatch(r"([A-Za-z]+)([,.!]?)", part)
        if match is None:
            return False
        word, punctuation = match.groups()
        if last and not punctuation:
            return any(
                surface.startswith(word)
                for node in nodes
                for symbol in node
                if symbol is not None
                for surface in _surfaces(symbol, initial)
            )
        for token in (word, punctuation) if punctuation else (word,):
            nodes, initial = _advance(nodes, token, initial), False
            if not nodes:
                return False
            if token in (".", "!"):
                nodes, initial = [root], True
    return True
