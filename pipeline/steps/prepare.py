"""`prepare` stage: the demo world's pretraining corpus and the train/eval prompt sets."""
from __future__ import annotations

from pipeline.data.world import generate_reviews, review_prefixes


def prepare(*, run_id: str, seed: int, n_reviews: int, n_train_prompts: int, n_eval_prompts: int,
            prefix_min_words: int, prefix_max_words: int) -> tuple[list[str], list[dict]]:
    """Generate the corpus and prompts of the synthetic review world.

    Returns:
        (corpus, prompt_rows): review texts for the base model, and rows of the `prompts` table
        (round 0). Train and eval prompts come from separate seed streams.
    """
    corpus = generate_reviews(n_reviews, seed=seed)
    rows = []
    for split, n, split_seed in (("train", n_train_prompts, seed + 1), ("eval", n_eval_prompts, seed + 2)):
        texts = review_prefixes(n, seed=split_seed, min_words=prefix_min_words, max_words=prefix_max_words)
        rows += [
            {"run_id": run_id, "round": 0, "prompt_id": f"{split}-{i:05d}", "split": split,
             "text": text, "reference": ""}
            for i, text in enumerate(texts)
        ]
    return corpus, rows
