"""`prepare` stage: the task's pretraining corpus and its train/eval prompt sets."""
from __future__ import annotations

import inspect

from pipeline.core.config import WorldParams
from pipeline.core.errors import ConfigError
from pipeline.tasks import get_task


def prepare(*, task: str, run_id: str, seed: int, world: WorldParams,
            base_model: str | None = None, pad_token: str | None = None) -> tuple[list[str], list[dict]]:
    """Build the corpus and prompts of `task` from `world.source` (pipeline/tasks/<task>.py `build`).

    With ``world.prefix_unit: tokens`` the task's builder gets the tokenizer of `base_model`
    (``base.model``: SFT never changes it, so prepare can run before the base stage).

    Params: task: run.task; run_id: run.run_id; seed: run.seed; world: the WorldParams section;
    base_model: base.model (a local folder or hub id), needed for token prefixes only.
    Returns:
        (corpus, prompt_rows): texts for the base model, and rows of the `prompts` table (round 0;
        `reference` filled for summarization). Train and eval prompts come from separate seed streams.
    Raises: DataError for a missing, malformed or (after filtering) empty data source; ConfigError
    for token prefixes without base.model or on a task whose prompts are not prefixes.
    """
    builder = get_task(task).build
    extra = {}
    if world.prefix_unit == "tokens":
        if "tokenizer" not in inspect.signature(builder).parameters:
            raise ConfigError(f"'world.prefix_unit' = 'tokens' is not supported by task {task!r}: use 'words'.")
        if base_model is None:
            raise ConfigError("'world.prefix_unit' = 'tokens' needs a pretrained tokenizer: set 'base.model' to a "
                              "local HF model folder (e.g. a saved gpt2-large), or use prefix_unit 'words'.")
        from pipeline.model.pretrain import load_pretrained_tokenizer

        extra["tokenizer"] = load_pretrained_tokenizer(base_model, pad_token)
    corpus, splits = builder(world, seed=seed, **extra)
    rows = []
    for split in ("train", "eval"):
        rows += [
            {"run_id": run_id, "round": 0, "prompt_id": f"{split}-{i:05d}", "split": split,
             "text": prompt["text"], "reference": prompt.get("reference", ""),
             **({"columns": prompt["columns"]} if "columns" in prompt else {})}
            for i, prompt in enumerate(splits[split])
        ]
    return corpus, rows
