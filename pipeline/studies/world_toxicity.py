"""The fair toxicity world of the study: a classifier reward on sequence-level labels, the lexicon critic.

Environment reward: 1 - P(toxic) of the response under a multinomial naive Bayes classifier
(pipeline/evaluate/naive_bayes.py) fit on *sequence-level* labels of comments of the synthetic
comment world (pipeline/data/toxicity_world.py), drawn from the study's own seed stream. The label
is the comment's, not its words': a toxic comment's sentences are each toxic with probability 0.8,
so some comments labelled toxic hold only civil words, and the classifier learns civil words as
evidence too. The critic is the lexicon backend (pipeline/critic/offline/lexicon.py): it names the terms of
the offline toxicity lexicon (pipeline/rewards/toxicity.py) as "toxic" spans, and nothing else.
Evaluation uses the task's own metrics (pipeline/tasks/toxicity.py Evaluator: expected maximum
toxicity and toxicity probability) with the demo's toxicity source, the lexicon - the same word
list the critic reads, so those two columns favour the critic arms; the classifier reward is
reported beside them.

Degradation measures: the share of query+response texts that are a prefix of a sequence of the
world's comment sentences (a recogniser built here from the world's templates and word classes,
polarity ignored), the share of a response's words that repeat an earlier word of it, civil
slot words per response (what the classifier pays for and a policy could pile up) and toxic
lexicon terms per response.
"""
from __future__ import annotations

import itertools
import re
from functools import lru_cache

from pipeline.data.toxicity_world import (
    CIVIL_WORDS,
    TEMPLATES,
    TOPICS,
    TOXIC_WORDS,
    comment_prefixes,
    generate_labelled_comments,
)
from pipeline.evaluate.metrics import distinct_n
from pipeline.rewards.toxicity import LexiconToxicity, ToxicityReward, toxic_terms
from pipeline.studies.world import ClassifierStudyWorld
from pipeline.tasks.toxicity import Evaluator

_WORD = re.compile(r"[A-Za-z]+")
CIVIL_SLOT_WORDS = frozenset(w.lower() for group in CIVIL_WORDS.values() for phrase in group for w in phrase.split())


def labelled_comments(n: int, *, seed: int) -> list[tuple[str, int]]:
    """n (comment, 1 if the comment is toxic else 0) pairs from a seed stream apart from the corpus's.

    Uses the world's own comment generator, so texts and labels follow the world's rules exactly.
    """
    pairs = generate_labelled_comments(n, seed=seed, stream="drlc-study-labelled-comments")
    return [(text, int(toxic)) for text, toxic in pairs]


def _format(words: list[str]) -> str:
    """The world's surface rules (toxicity_world._sentence): punctuation attached, a -> an, capitalised."""
    text = re.sub(r" ([,.])", r"\1", " ".join(words))
    text = re.sub(r"\ba ([aeio])", r"an \1", text)
    return text[:1].upper() + text[1:]


@lru_cache(maxsize=1)
def sentence_trie() -> dict:
    """A word trie of every sentence the comment grammar produces (either polarity per slot); None ends one."""
    options = {slot: CIVIL_WORDS[slot] + TOXIC_WORDS[slot] for slot in CIVIL_WORDS} | {"TOPIC": TOPICS}
    root: dict = {}
    for template in TEMPLATES:
        slots = template.split(" ")
        for filling in itertools.product(*[options.get(s, (s,)) for s in slots]):
            node = root
            for word in _format(list(filling)).split(" "):
                node = node.setdefault(word, {})
            node[None] = {}
    return root


def is_comment_prefix(text: str) -> bool:
    """Whether `text` starts some sequence of grammar sentences joined by single spaces (may stop mid-word)."""
    root = sentence_trie()
    node, parts = root, text.split(" ")
    for position, part in enumerate(parts):
        last = position == len(parts) - 1
        if part == "":
            return last and position > 0 or text == ""
        if last:
            return any(w is not None and w.startswith(part) for w in node) or (
                None in node and any(w.startswith(part) for w in root))
        if part not in node and None in node:
            node = root  # the previous word ended a sentence: a new one starts here
        if part not in node:
            return False
        node = node[part]
    return True


class ToxicityStudyWorld(ClassifierStudyWorld):
    """Prompts, environment reward, degradation measures and evaluation metrics of the toxicity study."""

    name = "toxicity"

    def __init__(self, *, world_seed: int, n_train_prompts: int, n_eval_prompts: int, classifier_size: int):
        super().__init__(world_seed=world_seed, classifier_size=classifier_size, labelled=labelled_comments,
                         prefixes=comment_prefixes, prefix_world=_PrefixWorld(n_train_prompts, n_eval_prompts))
        self.evaluator = Evaluator(ToxicityReward(LexiconToxicity()))

    def env_rewards(self, responses: list[str], queries: list[str] | None = None) -> list[float]:
        """The sparse environment reward of each response: 1 - the reward classifier's P(toxic)."""
        return [1.0 - p for p in self.reward_classifier.predict_proba(responses)]

    @staticmethod
    def degradation(queries: list[str], responses: list[str]) -> dict:
        """Grammatical share, repeated-word share, civil slot words and toxic terms per response of a batch."""
        words = [[w.lower() for w in _WORD.findall(r)] for r in responses]
        n_words = sum(len(w) for w in words)
        repeats = sum(len(w) - len(set(w)) for w in words)
        grammatical = sum(is_comment_prefix(q + r) for q, r in zip(queries, responses, strict=True))
        return {"grammatical": grammatical / len(responses),
                "repeated_word_share": repeats / n_words if n_words else 0.0,
                "civil_per_response": sum(w in CIVIL_SLOT_WORDS for ws in words for w in ws) / len(responses),
                "toxic_per_response": sum(len(toxic_terms(r)) for r in responses) / len(responses)}

    def eval_metrics(self, queries: list[str], texts_by_prompt: list[list[str]]) -> dict:
        """The task's metrics (lexicon toxicity) on held-out prompts, plus the study's reward and degradation."""
        texts = [t for group in texts_by_prompt for t in group]
        flat_queries = [q for q, group in zip(queries, texts_by_prompt, strict=True) for _ in group]
        task_metrics, _ = self.evaluator.metrics(texts_by_prompt, [{"text": q} for q in queries])
        env = self.env_rewards(texts)
        return {**task_metrics, "env_reward_mean": sum(env) / len(env),
                "dist_1": distinct_n(texts_by_prompt, 1), "dist_2": distinct_n(texts_by_prompt, 2),
                "dist_3": distinct_n(texts_by_prompt, 3), **self.degradation(flat_queries, texts),
                "n_samples": len(texts)}


class _PrefixWorld:
    """The WorldParams fields prefix_prompt_splits reads, with the toxicity demo's 2-4 word openings."""

    prefix_min_words, prefix_max_words = 2, 4

    def __init__(self, n_train_prompts: int, n_eval_prompts: int):
        self.n_train_prompts, self.n_eval_prompts = n_train_prompts, n_eval_prompts
