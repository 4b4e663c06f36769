"""The synthetic comment world: a seeded generator of short online comments, civil or toxic.

The offline detoxification demo needs text a tiny GPT-2 learns in a minute, whose toxicity
the local lexicon scorer (pipeline/rewards/toxicity.py) reads exactly, and openings that
can go either way, so a policy has a real choice to learn.

A comment is 1-2 sentences. Each sentence is one of ``TEMPLATES``, whose slots are filled
from word classes that come in a civil and a toxic version: ``PADJ`` (adjectives for people
and posts: "thoughtful" / "stupid"), ``PERSON`` ("friend" / "idiot"), ``OPENER`` ("Look" /
"Shut up"); ``TOPIC`` (post, article, ...) is neutral. Every template mixes fixed words with
at least one polar slot, and civil and toxic sentences share their openings ("You are a ..."),
so the first words of a comment do not decide its toxicity. A comment is toxic with
probability ``TOXIC_SHARE``; a toxic comment's sentences are toxic with probability 0.8, a
civil comment's never. Every toxic word is in the scorer's lexicon; no civil word is.

Queries (``comment_prefixes``) are the first 2-4 words of a fresh comment, cut before its
first toxic word (comments opening with one are skipped), from a seed stream separate from
the corpus. The world cannot show
anything about implicit toxicity, sarcasm or identity attacks: toxicity here is lexical.
"""
from __future__ import annotations

import random
import re

from pipeline.core.errors import ConfigError

TOXIC_SHARE = 0.4
CIVIL_WORDS = {
    "PADJ": ("thoughtful", "interesting", "useful", "clear", "helpful", "kind", "fair", "smart", "reasonable",
             "honest", "careful", "calm", "friendly", "patient"),
    "PERSON": ("friend", "neighbour", "person", "reader", "writer", "colleague", "stranger", "guy", "buddy"),
    "OPENER": ("Look", "Well", "Honestly", "Listen", "Okay"),
}
TOXIC_WORDS = {
    "PADJ": ("stupid", "idiotic", "pathetic", "worthless", "dumb", "disgusting", "moronic", "ugly", "useless",
             "ridiculous"),
    "PERSON": ("idiot", "moron", "loser", "clown", "jerk", "fool", "creep", "freak", "imbecile"),
    "OPENER": ("Shut up", "Damn", "Get lost", "What crap"),
}
TOPICS = ("post", "article", "comment", "video", "plan", "idea", "review", "update", "photo", "story", "argument",
          "question", "answer", "thread", "point")
TEMPLATES = (
    "You are a PADJ PERSON .",
    "Only a PADJ PERSON would write this TOPIC .",
    "Your TOPIC is PADJ .",
    "I think this TOPIC is PADJ .",
    "Thanks for the TOPIC , PERSON .",
    "What a PADJ TOPIC .",
    "OPENER , your TOPIC is PADJ .",
    "Honestly , you sound like a PADJ PERSON .",
    "This is the most PADJ TOPIC I have read .",
    "Please stop posting PADJ TOPIC , PERSON .",
    "Anyone who likes this TOPIC is a PERSON .",
    "I read your TOPIC and it was PADJ .",
)


def _sentence(template: str, toxic: bool, rng: random.Random) -> str:
    words = []
    for slot in template.split(" "):
        if slot in CIVIL_WORDS:
            words.append(rng.choice((TOXIC_WORDS if toxic else CIVIL_WORDS)[slot]))
        elif slot == "TOPIC":
            words.append(rng.choice(TOPICS))
        else:
            words.append(slot)
    text = re.sub(r" ([,.])", r"\1", " ".join(words))
    text = re.sub(r"\ba ([aeio])", r"an \1", text)
    return text[:1].upper() + text[1:]


def _comment(rng: random.Random) -> tuple[str, bool]:
    toxic = rng.random() < TOXIC_SHARE
    sentences = [_sentence(rng.choice(TEMPLATES), toxic and rng.random() < 0.8, rng)
                 for _ in range(rng.randint(1, 2))]
    return " ".join(sentences), toxic


def generate_comments(n: int, *, seed: int) -> list[str]:
    """``n`` comments of the world, deterministic in (n, seed); a prefix of a longer list.

    Raises: ConfigError if n is negative.
    """
    return [text for text, _ in generate_labelled_comments(n, seed=seed)]


def generate_labelled_comments(n: int, *, seed: int, stream: str = "drlc-comments") -> list[tuple[str, bool]]:
    """``n`` (comment, is_toxic) pairs: generate_comments's texts with the comment-level label
    (a toxic comment's sentences are each toxic with probability 0.8, so the label is noisy per word).

    stream names the random stream: another stream gives comments apart from the corpus's.
    Raises: ConfigError if n is negative.
    """
    if n < 0:
        raise ConfigError(f"number of comments must be >= 0, got n={n}; pass a count such as 20000")
    rng = random.Random(f"{stream}:{seed}")
    return [_comment(rng) for _ in range(n)]


def _first_toxic_word(words: list[str]) -> int:
    toxic = {w.lower() for group in TOXIC_WORDS.values() for phrase in group for w in phrase.split()}
    for index, word in enumerate(words):
        if word.strip(",.!").lower() in toxic:
            return index
    return len(words)


def comment_prefixes(n: int, *, seed: int, min_words: int = 2, max_words: int = 4) -> list[str]:
    """Openings of fresh comments (PPO queries): the first k words, k uniform in [min_words,
    max_words], cut before the first toxic word ("You are a"); comments that open with a toxic word are skipped.

    Raises: ConfigError if n < 0 or not 1 <= min_words <= max_words.
    """
    if n < 0 or not 1 <= min_words <= max_words:
        raise ConfigError(f"comment prefixes need n >= 0 and 1 <= min_words <= max_words, got n={n}, "
                          f"min_words={min_words}, max_words={max_words}; try 2 and 4")
    rng = random.Random(f"drlc-comment-prefixes:{seed}")
    prefixes = []
    while len(prefixes) < n:
        words = _comment(rng)[0].split(" ")
        if _first_toxic_word(words) == 0:
            continue  # a toxic first word ("Damn, ...") leaves no civil opening
        k = min(rng.randint(min_words, max_words), _first_toxic_word(words))
        prefixes.append(" ".join(words[:k]).rstrip(","))
    return prefixes
