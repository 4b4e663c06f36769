"""Summarization task: write a TL;DR of a document; reward = ROUGE-1 F1 x 100 against the reference
(``score.scorer: rouge1``) or a reward model's score (``score.scorer: reward_model``,
``score.model`` = the model folder, pipeline/rewards/reward_model.py; ``score.normalize``
z-normalises it per round as the paper did).

- Demo (``world.source: world``): the synthetic news world
  (pipeline/data/summarization_world.py); ROUGE in pipeline/rewards/summarization.py.
  Queries are about 45 tokens: the profile sets ``base.block_size`` 128.
- Local data / paper: a JSONL/CSV/Parquet file or folder with a document column (``query``
  as in OpenAI's TL;DR PPO samples, ``prompt`` as in CarperAI/openai_summarize_tldr, or
  ``document``) and a reference column (``reference_responses``, ``label``, ``summary`` or
  ``reference``). A query always ends with "TL;DR:". The base corpus is query + reference.
  (The paper fine-tunes GPT-2 on TL;DR first: a later issue.)
- Critic fields: the document (the query without "TL;DR:"), the summary and its score.
- Evaluation: ROUGE-1/2/L F1 x 100 of every sample against its prompt's reference; with
  ``evaluate.reward_model`` also ``rm_score`` (mean RM score of the samples),
  ``rm_reference_score`` (mean RM score of the prompts' references) and ``win_rate`` (share of
  samples scored above their prompt's reference, ties count half; docs/evaluation.md).
"""
from __future__ import annotations

from pipeline.core.errors import ConfigError, DataError

SCORERS = ("rouge1", "reward_model")
MODEL_SCORERS = ("reward_model",)  # scorers that read score.model
DATA_SCORERS = ()  # scorers fit at load time to score.train_data
EVAL_NEEDS_REFERENCES = True  # evaluation scores against each prompt's reference
SEPARATOR = "TL;DR:"
DOCUMENT_COLUMNS = ("query", "prompt", "document")
REFERENCE_COLUMNS = ("reference_responses", "label", "summary", "reference")


def build(world, *, seed: int) -> tuple[list[str], dict[str, list[dict]]]:
    """(corpus, {"train": prompts, "eval": prompts}) with references; see the module docstring."""
    if world.source == "world":
        from pipeline.data.summarization_world import generate_documents, summarization_prompts

        return generate_documents(world.n_reviews, seed=seed), {
            "train": summarization_prompts(world.n_train_prompts, seed=seed + 1),
            "eval": summarization_prompts(world.n_eval_prompts, seed=seed + 2)}
    return _build_local(world, seed=seed)


def _query(document: str) -> str:
    document = document.strip()
    return document if document.endswith(SEPARATOR) else f"{document}\n{SEPARATOR}"


def _build_local(world, *, seed: int) -> tuple[list[str], dict[str, list[dict]]]:
    from pipeline.data.local import field, pick_column, read_records, split_items

    records = read_records(world.source)
    doc_col = pick_column(records, DOCUMENT_COLUMNS, source=world.source, what="document")
    ref_col = pick_column(records, REFERENCE_COLUMNS, source=world.source, what="reference summary")
    pairs = [{"text": _query(str(field(r, doc_col))), "reference": " ".join(str(field(r, ref_col)).split())}
             for r in records if str(field(r, doc_col) or "").strip() and str(field(r, ref_col) or "").strip()]
    if not pairs:
        raise DataError(f"Data source '{world.source}' has no row with both '{doc_col}' and '{ref_col}' filled.")
    corpus = [f"{p['text']} {p['reference']}".replace("\n", " ") for p in pairs][:world.n_reviews]
    return corpus, split_items(pairs, n_train=world.n_train_prompts, n_eval=world.n_eval_prompts, seed=seed,
                               source=world.source)


def reward_range(score) -> tuple[float | None, float | None]:
    """The bounds of make_reward(score)'s rewards, in the task's units (rouge1: [0, 100]; a reward model:
    unbounded)."""
    from pipeline.rewards.summarization import RewardModelReward, RougeReward

    return (RougeReward if score.scorer == "rouge1" else RewardModelReward).RANGE


def make_reward(score):
    """The environment reward of the ScoreParams section: ROUGE-1, or a reward model (score.model)."""
    from pipeline.rewards.summarization import RewardModelReward, RougeReward

    if score.scorer == "rouge1":
        return RougeReward()
    if not score.model:
        raise ConfigError("'score.scorer' = 'reward_model' needs 'score.model': a local reward-model folder "
                          "(docs/evaluation.md: sequence classifier, or trunk config + state dict).")
    return RewardModelReward(score.model, batch_size=score.batch_size)


def critic_fields(row: dict) -> dict[str, str]:
    document = row["query"].strip()
    if document.endswith(SEPARATOR):
        document = document[:-len(SEPARATOR)].rstrip()
    return {"document": document, "summary": row["response"].strip(), "score": f"{float(row['env_reward']):.1f}"}


class Evaluator:
    """rouge1, rouge2, rougeL: mean F1 x 100 of the samples against their prompt's reference; with a
    reward model also rm_score, rm_reference_score and win_rate (per-sample column rm_score)."""

    def __init__(self, reward_model=None) -> None:
        self.reward_model = reward_model

    def metrics(self, texts_by_prompt: list[list[str]], prompts: list[dict]) -> tuple[dict, dict]:
        from pipeline.rewards.summarization import rouge_l, rouge_n

        if any(not p.get("reference") for p in prompts):
            raise DataError("Summarization evaluation needs a reference per prompt: set 'evaluate.prompts' to "
                            "[world] (the prepared eval split).")
        pairs = [(t, p["reference"]) for texts, p in zip(texts_by_prompt, prompts) for t in texts]
        mean = lambda f: 100.0 * sum(f(t, r) for t, r in pairs) / len(pairs)
        metrics = {"rouge1": mean(lambda t, r: rouge_n(t, r, 1)), "rouge2": mean(lambda t, r: rouge_n(t, r, 2)),
                   "rougeL": mean(rouge_l)}
        if self.reward_model is None:
            return metrics, {"rm_score": [None] * len(pairs)}
        rm_metrics, sample_scores = self._reward_model_metrics(texts_by_prompt, prompts)
        return {**metrics, **rm_metrics}, {"rm_score": sample_scores}

    def _reward_model_metrics(self, texts_by_prompt: list[list[str]], prompts: list[dict]) -> tuple[dict, list]:
        from pipeline.evaluate.metrics import win_rate

        documents = [p["text"] for texts, p in zip(texts_by_prompt, prompts) for _ in texts]
        samples = self.reward_model.score(documents, [t for texts in texts_by_prompt for t in texts])
        references = self.reward_model.score([p["text"] for p in prompts], [p["reference"] for p in prompts])
        opponents = [ref for texts, ref in zip(texts_by_prompt, references) for _ in texts]
        return {"rm_score": sum(samples) / len(samples), "rm_reference_score": sum(references) / len(references),
                "win_rate": win_rate(samples, opponents)}, samples


def make_evaluator(evaluate, reward, *, seed: int) -> Evaluator:
    """The evaluator; evaluate.reward_model (a folder) adds the RM metrics. The training reward's model is
    reused when it is the same folder."""
    if not evaluate.reward_model:
        return Evaluator()
    from pathlib import Path

    from pipeline.rewards.reward_model import RewardModel

    model = getattr(reward, "model", None)
    if isinstance(model, RewardModel) and model.folder.resolve() == Path(evaluate.reward_model).resolve():
        return Evaluator(model)
    return Evaluator(RewardModel(evaluate.reward_model, batch_size=evaluate.batch_size))
