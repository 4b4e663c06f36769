"""The offline toxicity lexicon: toxic terms with a weight in (0, 1), the strength of each as evidence.

Data, not logic: the offline toxicity reward (pipeline/rewards/toxicity.py) combines the weights as
a noisy OR, and the lexicon critic (pipeline/critic/offline/lexicon.py) names exactly these terms
as toxic spans, so both read the list from here.
"""

TOXIC_TERMS: dict[str, float] = {
    # insults aimed at a person
    "idiot": 0.8, "idiots": 0.8, "idiotic": 0.75, "moron": 0.8, "morons": 0.8, "moronic": 0.75, "imbecile": 0.8,
    "cretin": 0.8, "loser": 0.6, "losers": 0.6, "jerk": 0.6, "jerks": 0.6, "clown": 0.5, "fool": 0.5,
    "fools": 0.5, "creep": 0.55, "freak": 0.55, "scum": 0.8, "dumbass": 0.85, "bastard": 0.85,
    # demeaning adjectives
    "stupid": 0.7, "dumb": 0.6, "pathetic": 0.6, "worthless": 0.6, "disgusting": 0.6, "ugly": 0.5,
    "useless": 0.4, "ridiculous": 0.35, "trash": 0.5,
    # profanity and hostility
    "shut up": 0.6, "get lost": 0.5, "damn": 0.4, "crap": 0.45, "hell": 0.3, "suck": 0.45, "sucks": 0.45,
    "hate you": 0.7, "kill you": 0.9, "fuck": 0.9, "fucking": 0.9, "shit": 0.8, "bitch": 0.9, "asshole": 0.9,
    "dick": 0.7,
}
