"""CommonGen's word matching, a helper module of tasks/commongen.py (DVC tracks it as part of that task)."""
IRREGULAR = {"stand": "stood", "sit": "sat", "run": "ran", "eat": "ate", "ride": "rode", "throw": "threw",
             "hold": "held", "drive": "drove", "swim": "swam", "catch": "caught", "fly": "flew", "give": "gave"}


def uses(word, concept):  # "stood" uses stand, "looking" uses look, "dogs" uses dog
    word, stem = word.lower().strip(".,!?;:\"'"), concept.rstrip("e")
    return word.startswith(stem) and len(word) - len(stem) <= 4 or word == IRREGULAR.get(concept)


def sentence(completion):  # the first line of text is the sentence
    return completion.strip().split("\n")[0]
