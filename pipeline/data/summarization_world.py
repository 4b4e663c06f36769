"""The synthetic news world: seeded short reports of one local event, each with a reference summary.

The offline summarization demo needs documents a tiny GPT-2 reads in one context window,
a summary it learns to write within its pretraining budget, and a pretraining corpus whose
summaries are often flawed, so that ROUGE against the reference varies between samples and
PPO has something to improve that the base model does not already do.

An event is one of ``EVENTS`` (a fire, a flood, a strike, ...). Its document is the event's
lead sentence, one of its cue sentences and one or two filler sentences (the weather, the
market, a witness), in random order, about 25 words. Its reference summary is the event's
headline: a sentence the document never contains verbatim, but whose words the lead sentence
holds (so the offline lexicon critic, which flags summary words absent from the document,
never flags the reference, and flags another event's headline). A query is the document
followed by " TL;DR:". In the pretraining corpus (``generate_documents``) each document is
followed by the reference with probability ``FAITHFUL_SHARE`` and otherwise by one of the
flawed kinds in ``FLAWS``, chosen uniformly:

- ``filler``: one of the document's filler sentences (ROUGE-1 F1 with the reference about 0-0.2);
- ``wrong_event``: the headline of another event (about 0-0.2);
- ``truncated``: the headline's first three words (0.67 for a six-word headline);
- ``padded``: the headline followed by a filler sentence (about 0.7).

A base model that learns the corpus writes the reference about ``FAITHFUL_SHARE`` of the time
(measured: 44% exact, mean ROUGE-1 0.65 after 400 steps), and every flaw is decided in the first words or at the end of
the headline, where a policy can learn to avoid it. Every filler kind has several variants.

Why events and not copied entities: an earlier version asked for "<name> <verb> <number>
<objects> in <city>" copied from the document; the demo's 2-layer GPT-2 did not learn to copy
numbers and cities within its pretraining budget (400-800 steps), so ROUGE varied with random
entity guesses that PPO could not fix in a few rounds. Recognising an event from cue words is
learnt within 400 steps, and what is left for PPO is the choice the corpus taught wrongly.

What it cannot show: entity copying, abstraction over long documents, paraphrase. Headlines
are fixed strings, so ROUGE-1 here rewards naming the right event completely and nothing else.
"""
from __future__ import annotations

import random

from pipeline.core.errors import ConfigError

EVENTS = {  # event: (headline = reference summary, lead sentence, cue sentences)
    "fire": ("Fire burned down the old mill.", "The old mill burned down after a fire started.",
             ("Smoke rose over the roofs.", "Firefighters worked all night.", "Ash covered the street.")),
    "flood": ("Floods closed the river road.", "The river road closed when the floods came.",
              ("Water filled the cellars.", "Boats carried people to safety.", "Sandbags lined the bank.")),
    "strike": ("Workers went on strike for pay.", "Workers asked for more pay and went on strike.",
               ("The factory gates stayed shut.", "Pickets stood in a line.", "No trains left the depot.")),
    "concert": ("Crowds cheered at the park concert.", "Crowds cheered at the park as the concert began.",
                ("A band played until midnight.", "Fans sang every song.", "The stage glowed with lights.")),
    "storm": ("Storm winds broke many trees.", "Many trees broke in the storm winds.",
              ("Branches fell on parked cars.", "The power went out.", "Roof tiles flew across the yard.")),
    "election": ("Voters chose a new mayor.", "Voters went out and chose a new mayor.",
                 ("Queues formed at every polling station.", "The votes were counted by dawn.",
                  "Turnout was high.")),
    "match": ("The home team won the final.", "The home team won the final at the stadium.",
              ("The striker scored twice.", "Fans ran onto the pitch.", "The keeper saved a penalty.")),
    "festival": ("The town held a food festival.", "The town held a food festival on Sunday.",
                 ("Stalls sold bread and cheese.", "Cooks gave out free samples.", "Music played in the square.")),
}
FILLERS = {
    "weather": ("The weather was cold.", "The weather was warm.", "It was a grey day.", "The sky was clear."),
    "market": ("The market closed early.", "The shops opened late.", "The bakery sold out by noon."),
    "witness": ("Anna watched from a window.", "Ben saw it from the bridge.", "A neighbour took photos.",
                "Carla heard the news on the radio."),
}
FAITHFUL_SHARE = 0.4
FLAWS = ("filler", "wrong_event", "truncated", "padded")
SEPARATOR = " TL;DR:"


def _event(rng: random.Random) -> dict:
    name = rng.choice(sorted(EVENTS))
    headline, lead, cues = EVENTS[name]
    fillers = [rng.choice(FILLERS[kind]) for kind in rng.sample(sorted(FILLERS), rng.randint(1, 2))]
    return {"name": name, "headline": headline, "cues": [lead, rng.choice(cues)], "fillers": fillers}


def _document(e: dict, rng: random.Random) -> str:
    sentences = e["cues"] + e["fillers"]
    rng.shuffle(sentences)
    return " ".join(sentences)


def reference_summary(e: dict) -> str:
    return e["headline"]


def _flawed_summary(e: dict, flaw: str, rng: random.Random) -> str:
    if flaw == "filler":
        return rng.choice(e["fillers"])
    if flaw == "wrong_event":
        return EVENTS[rng.choice([n for n in sorted(EVENTS) if n != e["name"]])][0]
    if flaw == "truncated":
        return " ".join(e["headline"].split()[:3]) + "."
    return f"{e['headline']} {rng.choice(e['fillers'])}"


def _pair(rng: random.Random) -> tuple[str, str, str]:
    """(document, reference, corpus summary) of one fresh event."""
    e = _event(rng)
    document, reference = _document(e, rng), reference_summary(e)
    faithful = rng.random() < FAITHFUL_SHARE
    return document, reference, reference if faithful else _flawed_summary(e, rng.choice(FLAWS), rng)


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
