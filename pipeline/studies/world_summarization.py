"""The summarization world of the study: ROUGE-1 against the event's headline, the lexicon critic.

Environment reward: ROUGE-1 F1 (in [0, 1], the demo's scale 0.01 x 100) of the summary against
the prompt's reference, the event's headline (pipeline/data/summarization_world.py). The critic is
the lexicon backend (pipeline/critic/offline/lexicon.py): it labels "irrelevant" every maximal run of
summary content words that never occur in the document; it never reads the reference or the
score, so it is not a re-reading of the reward. Evaluation: the task's ROUGE-1/2/L (x 100,
pipeline/tasks/summarization.py Evaluator).

Degradation measures: the share of summaries that are exactly the reference headline, exactly
another event's headline, contain a copied filler sentence of the world, are the truncated
headline (its first three words) or the padded one (headline + more), words per summary and the
share of a summary's words that repeat an earlier word of it.
"""
from __future__ import annotations

import re

from pipeline.data.summarization_world import EVENTS, FILLERS, summarization_prompts
from pipeline.evaluate.metrics import distinct_n
from pipeline.rewards.summarization import rouge_n
from pipeline.studies.world import StudyWorld
from pipeline.tasks.summarization import Evaluator

_WORD = re.compile(r"[A-Za-z]+")
HEADLINES = frozenset(headline for headline, _, _ in EVENTS.values())
FILLER_SENTENCES = tuple(s for group in FILLERS.values() for s in group)


def summary_kind(summary: str, reference: str) -> str:
    """What a summary is, in the world's terms: reference, wrong_event, truncated, padded, filler or other."""
    text = " ".join(summary.split())
    if text == reference:
        return "reference"
    if text in HEADLINES:
        return "wrong_event"
    if text == " ".join(reference.split()[:3]) + ".":
        return "truncated"
    if text.startswith(reference):
        return "padded"
    if any(f in text for f in FILLER_SENTENCES):
        return "filler"
    return "other"


class SummarizationStudyWorld(StudyWorld):
    """Prompts with references, environment reward, degradation measures and ROUGE evaluation."""

    name = "summarization"

    def __init__(self, *, world_seed: int, n_train_prompts: int, n_eval_prompts: int):
        train = summarization_prompts(n_train_prompts, seed=world_seed + 1)  # the task's split seeds
        evaluation = summarization_prompts(n_eval_prompts, seed=world_seed + 2)
        self.train_prompts = [p["text"] for p in train]
        self.eval_prompts = [p["text"] for p in evaluation]
        self.reference = {p["text"]: p["reference"] for p in train + evaluation}  # a document names its event
        self.evaluator = Evaluator()

    @classmethod
    def from_config(cls, cfg) -> "SummarizationStudyWorld":
        return cls(world_seed=cfg.world_seed, n_train_prompts=cfg.n_train_prompts, n_eval_prompts=cfg.n_eval_prompts)

    def env_rewards(self, responses: list[str], queries: list[str] | None = None) -> list[float]:
        """ROUGE-1 F1 in [0, 1] of each response against its query's reference."""
        assert queries is not None and len(queries) == len(responses), "summarization rewards need the queries"
        return [rouge_n(r, self.reference[q], 1) for r, q in zip(responses, queries)]

    def degradation(self, queries: list[str], responses: list[str]) -> dict:
        """Shares of each summary kind, words per summary and the repeated-word share of a batch."""
        kinds = [summary_kind(r, self.reference[q]) for q, r in zip(queries, responses, strict=True)]
        words = [[w.lower() for w in _WORD.findall(r)] for r in responses]
        n_words = sum(len(w) for w in words)
        out = {f"{kind}_share": kinds.count(kind) / len(kinds)
               for kind in ("reference", "wrong_event", "truncated", "padded", "filler", "other")}
        return {**out, "words_per_response": n_words / len(responses),
                "repeated_word_share": sum(len(w) - len(set(w)) for w in words) / n_words if n_words else 0.0}

    def eval_metrics(self, queries: list[str], texts_by_prompt: list[list[str]]) -> dict:
        """ROUGE-1/2/L x 100 of the held-out samples, plus the study's reward and degradation."""
        texts = [t for group in texts_by_prompt for t in group]
        flat_queries = [q for q, group in zip(queries, texts_by_prompt, strict=True) for _ in group]
        task_metrics, _ = self.evaluator.metrics(texts_by_prompt, [{"reference": self.reference[q]} for q in queries])
        env = self.env_rewards(texts, flat_queries)
        return {**task_metrics, "env_reward_mean": sum(env) / len(env),
                "dist_1": distinct_n(texts_by_prompt, 1), "dist_2": distinct_n(texts_by_prompt, 2),
                "dist_3": distinct_n(texts_by_prompt, 3), **self.degradation(flat_queries, texts),
                "n_samples": len(texts)}
