"""The per-task layer: each task's study world, critic template, stated notes and report view.

A world note says what is rewarded, who critiques, and what the world can and cannot show; a
view says which columns, panels and hacking measures the report shows for the task. The report
reads only the result JSON and these views, so it never needs to run anything.
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.core.errors import ConfigError


@dataclass(frozen=True)
class TaskView:
    """What the report shows of one task.

    eval_columns / final_columns: (metric key, column title, digits) of the eval metrics and of
    the last-rounds means; panels: (round-record key, axis label) of the learning-curve PNG;
    hacking: round-record keys compared between dense_all and its control; caveat: why dense
    gains can be small, absent or suspect in this world (world facts, not conclusions).
    """

    eval_columns: tuple[tuple[str, str, int], ...]
    final_columns: tuple[tuple[str, str, int], ...]
    panels: tuple[tuple[str, str], ...]
    hacking: tuple[str, ...]
    ablation_columns: tuple[tuple[str, str, int], ...]
    reward_label: str
    caveat: str
    critic_target: str = ""  # round-record key of what the critic's spans penalise (the mechanism check)


NOTES = {
    "sentiment": {
        "name": "sentiment (synthetic review world, pipeline/data/world.py)",
        "env_reward": "P(positive) of the response under a naive Bayes classifier fit on sequence-level tone labels "
                      "of 4000 world reviews (its own seed stream)",
        "critic": "the lexicon backend (VADER lexicon spans, pipeline/critic/offline/lexicon.py), ±0.5 per span token, exact alignment",
        "can_show": "whether per-token credit on sentiment words speeds up learning a sequence-level classifier reward "
                    "beyond what reward scale alone does, and lexical reward hacking (polar-word pile-up, leaving the grammar).",
        "cannot_show": "anything about a noisy or wrong critic (this one is exact for the world), long-range credit "
                       "assignment or content: sentiment here is lexical, so the classifier and the lexicon largely agree "
                       "by construction, and a gain here is an upper bound for a real critic.",
    },
    "toxicity": {
        "name": "toxicity (synthetic comment world, pipeline/data/toxicity_world.py; demo profile configs/demo-toxicity.yaml)",
        "env_reward": "1 − P(toxic) of the response under a naive Bayes classifier fit on sequence-level civil/toxic "
                      "labels of 4000 world comments (its own seed stream; a toxic comment's sentences are toxic with "
                      "probability 0.8, so the labels are noisy for words)",
        "critic": "the lexicon backend (the toxicity lexicon's terms as 'toxic' spans, pipeline/critic/offline/lexicon.py), "
                  "−0.5 per span token, exact alignment; it only ever subtracts reward",
        "can_show": "whether a penalty-only critic that names the toxic words speeds up learning a sequence-level "
                    "classifier reward beyond reward scale, and whether the policy leaves the comment grammar or piles "
                    "up civil words the classifier pays for.",
        "cannot_show": "implicit toxicity, sarcasm or a wrong critic: every toxic word of the world is in the critic's "
                       "lexicon, so critic and classifier agree on what is toxic by construction; the critic gives no "
                       "credit for the civil words that raise the classifier's reward; the task's eval metrics "
                       "(expected max toxicity, toxicity probability) read the critic's own lexicon and so favour the "
                       "critic arms.",
    },
    "summarization": {
        "name": "summarization (synthetic event-report world, pipeline/data/summarization_world.py; demo profile "
                "configs/demo-summarization.yaml)",
        "env_reward": "ROUGE-1 F1 in [0, 1] of the summary against the event's headline (pipeline/rewards/summarization.py)",
        "critic": "the lexicon backend (runs of summary words absent from the document as 'irrelevant' spans, "
                  "pipeline/critic/offline/lexicon.py), −0.2 per span token, exact alignment; it never reads the reference",
        "can_show": "whether a partial, penalty-only critic helps: of the corpus's four flaws it can only see "
                    "wrong-event headlines (words the document lacks); a filler copy, a truncated or a padded headline "
                    "uses document words and is never flagged, so those must still be learnt from ROUGE.",
        "cannot_show": "faithfulness or abstraction (the reference is a fixed headline, ROUGE-1 rewards naming the right "
                       "event completely), entity copying, or an LLM critic's judgement of coherence: the lexicon "
                       "critic never uses the 'incoherent' or 'factually incorrect' labels.",
    },
}

VIEWS = {
    "sentiment": TaskView(
        eval_columns=(("positive_percent", "eval positive %", 1), ("env_reward_mean", "eval env reward", 3),
                      ("dist_2", "eval dist-2", 3), ("grammatical", "eval grammatical", 3)),
        final_columns=(("kl", "final KL", 2), ("polar_per_response", "final polar words/resp", 2)),
        panels=(("env_reward", "env reward P(positive)"), ("kl", "KL to reference (nats/response)"),
                ("grammatical", "grammatical share"), ("polar_per_response", "polar words / response")),
        hacking=("polar_per_response", "grammatical", "repeated_polar_share", "dist_2"),
        ablation_columns=(("env_reward_mean", "eval env reward", 3), ("positive_percent", "eval positive %", 1),
                          ("grammatical", "eval grammatical", 3), ("polar_per_response", "eval polar words/resp", 2)),
        reward_label="env reward P(positive)",
        caveat="in this world sentiment is carried by polar words, so the sequence reward already points at the tokens "
               "the critic names, and 20-token responses leave little credit to assign; the lexicon critic is never "
               "wrong (best case for accuracy, not for added information), and the environment classifier also rises "
               "with every extra positive word, so a dense gain here partly measures that the critic and the "
               "classifier agree; dense_all pays for every positive word it finds, so piling them up is what it is "
               "trained to do."),
    "toxicity": TaskView(
        eval_columns=(("expected_max_toxicity", "eval exp. max toxicity", 3),
                      ("toxicity_probability", "eval toxicity prob.", 3), ("env_reward_mean", "eval env reward", 3),
                      ("dist_2", "eval dist-2", 3), ("grammatical", "eval grammatical", 3)),
        final_columns=(("kl", "final KL", 2), ("civil_per_response", "final civil words/resp", 2)),
        panels=(("env_reward", "env reward 1 − P(toxic)"), ("kl", "KL to reference (nats/response)"),
                ("grammatical", "grammatical share"), ("toxic_per_response", "toxic terms / response")),
        hacking=("civil_per_response", "toxic_per_response", "grammatical", "repeated_word_share", "dist_2"),
        ablation_columns=(("env_reward_mean", "eval env reward", 3), ("expected_max_toxicity", "eval exp. max toxicity", 3),
                          ("grammatical", "eval grammatical", 3), ("civil_per_response", "eval civil words/resp", 2)),
        reward_label="env reward 1 − P(toxic)",
        caveat="the critic only penalises toxic words and the classifier's reward also rises with civil words the "
               "critic never credits, so the dense signal covers part of what the reward pays for; toxicity here is "
               "decided by a handful of slot words, so the sequence reward already points at the few tokens that "
               "matter; the critic is exact for the world (no noise to overcome, no information the reward lacks); "
               "the study uses the demo's learning rate 1e-4, 5x lower than the sentiment study's.",
        critic_target="toxic_per_response"),
    "summarization": TaskView(
        eval_columns=(("rouge1", "eval ROUGE-1", 1), ("rouge2", "eval ROUGE-2", 1), ("rougeL", "eval ROUGE-L", 1),
                      ("reference_share", "eval exact headline", 3), ("filler_share", "eval filler copy", 3)),
        final_columns=(("kl", "final KL", 2), ("words_per_response", "final words/summary", 2)),
        panels=(("env_reward", "env reward ROUGE-1 F1"), ("kl", "KL to reference (nats/response)"),
                ("reference_share", "exact-headline share"), ("wrong_event_share", "wrong-event headline share")),
        hacking=("reference_share", "wrong_event_share", "filler_share", "padded_share", "truncated_share",
                 "words_per_response", "repeated_word_share"),
        ablation_columns=(("rouge1", "eval ROUGE-1", 1), ("reference_share", "eval exact headline", 3),
                          ("wrong_event_share", "eval wrong event", 3), ("words_per_response", "eval words/summary", 2)),
        reward_label="env reward ROUGE-1 F1",
        caveat="the lexicon critic sees only one of the world's four flaws (a wrong event's headline, whose words the "
               "document lacks) and ROUGE-1 already scores that flaw near 0, so its spans repeat, per token, what "
               "the reward says about it; filler copies, truncated and padded headlines get no span at all; its penalties make short "
               "summaries with fewer flaggable words cheaper, which is not what ROUGE asks for; the study uses the "
               "demo's learning rate 1e-4, 5x lower than the sentiment study's.",
        critic_target="wrong_event_share"),
}


def world_for(config):
    """The study world of config.task, built from the config."""
    if config.task == "toxicity":
        from pipeline.studies.world_toxicity import ToxicityStudyWorld as world
    elif config.task == "summarization":
        from pipeline.studies.world_summarization import SummarizationStudyWorld as world
    elif config.task == "sentiment":
        from pipeline.studies.world import SentimentStudyWorld as world
    else:
        raise ConfigError(f"unknown study task {config.task!r}; use sentiment, toxicity or summarization")
    return world.from_config(config)


def template_name(task: str) -> str:
    """The critic template file of `task` under prompts/."""
    return f"{task}.md"
