"""CommonGen as a short paragraph: write a few everyday sentences that, together, use every concept of a set.

The length sweep's task (docs/results.md): the reward keeps its meaning at any rollout.max_new_tokens (the
share of the set's concepts the text uses, wherever they are), and the rule critic marks the words that
earned it, wherever they are, so the critic's credit can land far from the last token.
"""
from commongen_words import uses  # the same word matching as tasks/commongen.py

RANGE, LABELS = (0.0, 1.0), ("concept", "filler")


def prompt(record):  # train lines are "field look stand", dev rows carry "field_N#look_V#stand_V"
    concepts = [c.split("_")[0] for c in record["concept_set"].split("#")] if "concept_set" in record \
        else record["text"].split()
    return {"prompt": f"Write a short paragraph using the words: {', '.join(concepts)}.\nParagraph:",
            "concepts": concepts}


def _words(text):
    return [w.strip(".,!?;:\"'()") for w in text.split()]


def coverage(prompts, completions, concepts):  # the share of the set's concepts the paragraph uses
    return [sum(any(uses(w, c) for w in _words(s)) for c in cs) / len(cs) for s, cs in zip(completions, concepts)]


REWARDS = [coverage]


def critic(response, concepts):  # concept words are good; a longer word said a third time is filler
    words = [w for w in _words(response) if w]
    used = [w for w in words if any(uses(w, c) for c in concepts)]
    lowered = [w.lower() for w in words]
    repeats = [w for i, w in enumerate(words) if len(w) > 3 and w not in used and lowered[:i].count(w.lower()) >= 2]
    return {"concept": list(dict.fromkeys(used)), "filler": list(dict.fromkeys(repeats))}


def metrics(prompts, completions, concepts):
    share = coverage(prompts, completions, concepts)
    return {"coverage": sum(share) / len(share), "all_concepts": sum(c == 1.0 for c in share) / len(share),
            "words": sum(len(_words(s)) for s in completions) / len(completions)}
