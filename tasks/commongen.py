"""CommonGen: write one everyday sentence that uses every concept of a set (field, look, stand)."""
from commongen_words import sentence, uses  # a helper module of tasks/: its edits re-run score and critique

RANGE, LABELS = (0.0, 1.0), ("concept", "filler")


def prompt(record):  # train lines are "field look stand", dev rows carry "field_N#look_V#stand_V"
    concepts = [c.split("_")[0] for c in record["concept_set"].split("#")] if "concept_set" in record \
        else record["text"].split()
    return {"prompt": f"Write a sentence using the words: {', '.join(concepts)}.\nSentence:", "concepts": concepts}


def coverage(prompts, completions, concepts):  # the share of the set's concepts the sentence uses
    return [sum(any(uses(w, c) for w in sentence(s).split()) for c in cs) / len(cs) for s, cs in zip(completions, concepts)]


def brevity(prompts, completions, max_words):  # 1 up to max_words words, falling to 0 at twice as many
    return [max(0.0, min(1.0, 2 - len(sentence(s).split()) / max_words)) for s in completions]


REWARDS, REWARD_WEIGHTS = [coverage, brevity], [1.0, "brevity_weight"]  # weights: score.settings.brevity_weight


def critic(response, concepts):  # concept words are good; a word said twice, and text after the sentence, is filler
    line, _, rest = response.strip().partition("\n")
    words = [w.strip(".,!?;:\"'") for w in line.split()]
    used = [w for w in words if any(uses(w, c) for c in concepts)]
    repeats = [w for i, w in enumerate(words) if len(w) > 3 and w not in used and w.lower() in map(str.lower, words[:i])]
    return {"concept": list(dict.fromkeys(used)),
            "filler": list(dict.fromkeys(repeats)) + ([rest.strip()] if rest.strip() else [])}


def metrics(prompts, completions, concepts):
    share = coverage(prompts, completions, concepts)
    return {"coverage": sum(share) / len(share), "all_concepts": sum(c == 1.0 for c in share) / len(share)}
