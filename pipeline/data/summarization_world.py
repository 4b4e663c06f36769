"""The synthetic news world: seeded short documents about one event, each with a reference summary.

The offline summarization demo needs documents a tiny GPT-2 reads in one context window, a
summary it can learn to write by copying, and summaries in the pretraining corpus that are
often wrong, so ROUGE against the reference varies and PPO has something to improve.

A document is the key sentence "On <day>, <name> <verb> <number> <objects> in <city>." and
2-3 filler sentences (weather, a witness, a drink, a closing time), in random order. Its
reference summary is "<name> <verb> <number> <objects> in <city>." A query is the document
followed by " TL;DR:". In the pretraining corpus (``generate_documents``) each document is
followed by a summary that is the reference with probability ``FAITHFUL_SHARE`` and otherwise
one of the flawed kinds in ``FLAWS``: the city dropped, a wrong number, a wrong name (one that
is not in the document), or a filler-style sentence (a witness or the weather; the witness
sentence is not always one the document holds). A document is about 30 words.

What it cannot show: abstraction, long documents, paraphrase. ROUGE-1 here rewards copying
the right entities, which is what the reward measures.
"""
from __future__ import annotations

import random

from pipeline.errors import ConfigError

NAMES = ("Anna", "Ben", "Carla", "David", "Emma", "Frank", "Grace", "Henry", "Iris", "Jack", "Kate", "Leo", "Mia",
         "Noah", "Olga", "Paul")
VERBS = ("bought", "sold", "painted", "repaired", "found", "lost", "borrowed", "delivered", "cleaned", "built")
NUMBERS = ("two", "three", "four", "five", "six", "seven", "eight", "nine")
OBJECTS = ("bikes", "chairs", "boats", "lamps", "books", "tables", "clocks", "kites", "boxes", "drums")
CITIES = ("Oslo", "Rome", "Lima", "Cairo", "Paris", "Berlin", "Tokyo", "Dublin", "Madrid", "Quito")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
WEATHER = ("cold", "warm", "rainy", "windy", "sunny", "grey")
DRINKS = ("tea", "coffee", "juice", "soup")
FAITHFUL_SHARE = 0.5
FLAWS = ("no_city", "wrong_number", "wrong_name", "filler")
SEPARATOR = " TL;DR:"


def _event(rng: random.Random) -> dict:
    return {"name": rng.choice(NAMES), "verb": rng.choice(VERBS), "number": rng.choice(NUMBERS),
            "object": rng.choice(OBJECTS), "city": rng.choice(CITIES), "day": rng.choice(DAYS),
            "witness": rng.choice(NAMES), "weather": rng.choice(WEATHER), "drink": rng.choice(DRINKS),
            "hour": rng.choice(NUMBERS)}


def _document(e: dict, rng: random.Random) -> str:
    fillers = [f"The weather was {e['weather']}.", f"{e['witness']} watched from a window.",
               f"Later {e['name']} had a cup of {e['drink']}.", f"The market closed at {e['hour']}."]
    sentences = rng.sample(fillers, rng.randint(2, 3))
    sentences.insert(rng.randint(0, len(sentences)),
                     f"On {e['day']}, {e['name']} {e['verb']} {e['number']} {e['object']} in {e['city']}.")
    return " ".join(sentences)


def reference_summary(e: dict) -> str:
    return f"{e['name']} {e['verb']} {e['number']} {e['object']} in {e['city']}."


def _flawed_summary(e: dict, flaw: str, rng: random.Random) -> str:
    if flaw == "no_city":
        return f"{e['name']} {e['verb']} {e['number']} {e['object']}."
    if flaw == "wrong_number":
        return reference_summary(dict(e, number=rng.choice([n for n in NUMBERS if n != e["number"]])))
    if flaw == "wrong_name":
        absent = [n for n in NAMES if n not in (e["name"], e["witness"])]
        return reference_summary(dict(e, name=rng.choice(absent)))
    return rng.choice((f"{e['witness']} watched from a window.", f"The weather was {e['weather']}."))


def _pair(rng: random.Random) -> tuple[str, str, str]:
    """(document, reference, corpus summary) of one fresh event."""
    e = _event(rng)
    reference = reference_summary(e)
    faithful = rng.random() < FAITHFUL_SHARE
    return _document(e, rng), reference, reference if faithful else _flawed_summary(e, rng.choice(FLAWS), rng)


def generate_documents(n: int, *, seed: int) -> list[str]:
    """``n`` pretraining texts "<document> TL;DR: <summary>" (summary often flawed, see module doc).

    Deterministic in (n, seed); the first m of a longer list equal generate_documents(m, seed).
    Raises: ConfigError if n is negative.
    """
    if n < 0:
        raise ConfigError(f"number of documents must be >= 0, got n={n}; pass a count such as 20000")
    rng = random.Random(f"drlc-documents:{seed}")
    return [f"{doc}{SEPARATOR} {summary}" for doc, _, summary in (_pair(rng) for _ in range(n))]


def summarization_prompts(n: int, *, seed: int) -> list[dict]:
    """``n`` prompts {text: "<document> TL;DR:", reference} from a seed stream apart from the corpus.

    Raises: ConfigError if n is negative.
    """
    if n < 0:
        raise ConfigError(f"number of prompts must be >= 0, got n={n}; pass a count such as 256")
    rng = random.Random(f"drlc-summarization-prompts:{seed}")
    return [{"text": f"{doc}{SEPARATOR}", "reference": reference} for doc, reference, _ in (_pair(rng) for _ in range(n))]
