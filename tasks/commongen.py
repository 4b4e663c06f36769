"""CommonGen: write one everyday sentence that uses every concept of a set (field, look, stand)."""
RANGE, LABELS = (0.0, 1.0), ("concept", "filler")
IRREGULAR = {"stand": "stood", "sit": "sat", "run": "ran", "eat": "ate", "ride": "rode", "throw": "threw",
             "hold": "held", "drive": "drove", "swim": "swam", "catch": "caught", "fly": "flew", "give": "gave"}

def prompt(record):  # train lines are "field look stand", dev rows carry "field_N#look_V#stand_V"
    concepts = [c.split("_")[0] for c in record["concept_set"].split("#")] if "concept_set" in record \
        else record["text"].split()
    return {"prompt": f"Write a sentence using the words: {', '.join(concepts)}.\nSentence:", "concepts": concepts}

def uses(word, concept):  # "stood" uses stand, "looking" uses look, "dogs" uses dog
    word, stem = word.lower().strip(".,!?;:\"'"), concept.rstrip("e")
    return word.startswith(stem) and len(word) - len(stem) <= 4 or word == IRREGULAR.get(concept)

def reward(prompts, completions, concepts):
    sentences = [c.strip().split("\n")[0].split() for c in completions]  # the first line of text is the sentence
    return [sum(any(uses(w, c) for w in words) for c in cs) / len(cs) for words, cs in zip(sentences, concepts)]

def critic(query, response):  # concept words are good; a word said twice, and text after the sentence, is filler
    concepts = query.split("words: ")[1].split(".\n")[0].split(", ")
    line, _, rest = response.strip().partition("\n")
    words = [w.strip(".,!?;:\"'") for w in line.split()]
    used = [w for w in words if any(uses(w, c) for c in concepts)]
    repeats = [w for i, w in enumerate(words) if len(w) > 3 and w not in used and w.lower() in map(str.lower, words[:i])]
    return {"concept": list(dict.fromkeys(used)),
            "filler": list(dict.fromkeys(repeats)) + ([rest.strip()] if rest.strip() and '"' not in rest else [])}

def metrics(prompts, completions, concepts):
    coverage = reward(prompts, completions, concepts)
    return {"coverage": sum(coverage) / len(coverage), "all_concepts": sum(c == 1.0 for c in coverage) / len(coverage)}
