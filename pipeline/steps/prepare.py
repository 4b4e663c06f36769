"""`prepare` stage: the task's pretraining corpus and its train/eval prompt sets."""
from __future__ import annotations

from pipeline.config import WorldParams
from pipeline.tasks import get_task


def prepare(*, task: str, run_id: str, seed: int, world: WorldParams) -> tuple[list[str], list[dict]]:
    """Build the corpus and prompts of `task` from `world.source` (pipeline/tasks/<task>.py `build`).

    Returns:
        (corpus, prompt_rows): texts for the base model, and rows of the `prompts` table (round 0;
        `reference` filled for summarization). Train and eval prompts come from separate seed streams.
    Raises: DataError for a missing, malformed or (after filtering) empty data source.
    """
    corpus, splits = get_task(task).build(world, seed=seed)
    rows = []
    for split in ("train", "eval"):
        rows += [
            {"run_id": run_id, "round": 0, "prompt_id": f"{split}-{i:05d}", "split": split,
             "text": prompt["text"], "reference": prompt.get("reference", "")}
            for i, prompt in enumerate(splits[split])
        ]
    return corpus, rows
