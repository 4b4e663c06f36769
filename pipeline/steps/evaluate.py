"""`evaluate` stage: sample continuations of each prompt set from the base and the final policy
(DExperts protocol) and compute the task's metrics for every (policy, prompt set).

Metrics per (policy, set): the task's own (pipeline/tasks/<task>.py `make_evaluator`:
sentiment positive_percent by a naive Bayes classifier that is not the reward; toxicity
expected_max_toxicity and toxicity_probability; summarization rouge1/rouge2/rougeL and, with
evaluate.reward_model, rm_score/rm_reference_score/win_rate), then
env_reward_mean (the training reward), perplexity (fluency LM), dist_1/2/3, kl_to_base (the mean over
samples of log pi(y|x) - log pi_base(y|x), summed over the response's tokens: how far the policy
drifted, 0 for the base), n_samples.
"""
from __future__ import annotations

import time

from transformers import AutoModelForCausalLM, AutoTokenizer

from pipeline.core.config import EvaluateParams, ScoreParams
from pipeline.core.device import module_device, place
from pipeline.core.store import SCHEMAS
from pipeline.evaluate.decode import sample_continuations
from pipeline.evaluate.metrics import conditional_perplexities, distinct_n, kl_to_reference, nanmean, response_logprobs
from pipeline.evaluate.prompts import load_prompt_sets
from pipeline.parallel.shard import Shard
from pipeline.steps.rollout import encode_query
from pipeline.steps.score import check_rewards, reward_inputs, reward_origin
from pipeline.tasks import get_task

SAMPLE_SCORE_COLUMNS = ("positive_prob", "rm_score")  # per-sample task scores kept in eval_samples


class FluencyLM:
    """The perplexity model: the run's base model (scores sampled ids) or another local model
    (re-tokenizes query and continuation text with its own tokenizer)."""

    def __init__(self, source: str, base_lm, device="cpu"):
        self.own_tokenizer = None if source == "base" else AutoTokenizer.from_pretrained(source)
        self.lm = base_lm if source == "base" else AutoModelForCausalLM.from_pretrained(source).to(device)

    def perplexities(self, *, queries, continuations, query_texts, texts, batch_size, shard=None) -> list[float]:
        if self.own_tokenizer is not None:
            tok = self.own_tokenizer
            bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
            queries = [bos + tok.encode(q) for q in query_texts]
            continuations = [tok.encode(t) for t in texts]
        return conditional_perplexities(self.lm, query_ids=queries, response_ids=continuations, batch_size=batch_size,
                                        shard=shard)


def _score_set(lm, tokenizer, prompts: list[dict], *, e: EvaluateParams, seed: int, evaluator, reward,
               fluency: FluencyLM, base_lm, shard: Shard | None = None) -> tuple[dict, list[dict]]:
    """Sample e.samples_per_prompt continuations per prompt; return (metrics, per-sample rows)."""
    k = e.samples_per_prompt
    query_texts = [p["text"] for p in prompts for _ in range(k)]
    queries = [encode_query(tokenizer, q) for q in query_texts]
    # evaluate.instruction (the prompting baseline) is seen by the sampler only: perplexity and
    # every score read the continuation of the plain prompt, as for a trained policy
    prompted = queries if not e.instruction else [encode_query(tokenizer, e.instruction + q) for q in query_texts]
    continuations = sample_continuations(lm, tokenizer, prompted, max_new_tokens=e.max_new_tokens, top_p=e.top_p,
                                         seed=seed, batch_size=e.batch_size, shard=shard)
    texts = [tokenizer.decode(c, skip_special_tokens=True) for c in continuations]
    per_response = [p for p in prompts for _ in range(k)]
    env = check_rewards(reward.score(texts, **reward_inputs(reward, per_response)),
                        [f"{p['prompt_id']}/sample={i % k}" for i, p in enumerate(per_response)],
                        who=reward_origin(reward))
    per_prompt = [texts[i:i + k] for i in range(0, len(texts), k)]
    task_metrics, per_sample = evaluator.metrics(per_prompt, prompts)
    # A task returns one per-sample list (positive_prob) or {column: per-sample list}.
    per_sample = per_sample if isinstance(per_sample, dict) else {"positive_prob": per_sample}
    columns = {c: per_sample.get(c) or [None] * len(texts) for c in SAMPLE_SCORE_COLUMNS}
    ppl = fluency.perplexities(queries=queries, continuations=continuations, query_texts=query_texts,
                               texts=texts, batch_size=e.batch_size, shard=shard)
    metrics = {**task_metrics, "env_reward_mean": sum(env) / len(env),
               "perplexity": nanmean(ppl), "dist_1": distinct_n(per_prompt, 1),
               "dist_2": distinct_n(per_prompt, 2), "dist_3": distinct_n(per_prompt, 3),
               "kl_to_base": _kl_to_base(lm, base_lm, queries, continuations, e.batch_size, shard),
               "n_samples": len(texts)}
    rows = [{"prompt_id": prompts[i // k]["prompt_id"], "sample": i % k, "query": query_texts[i], "response": texts[i],
             "env_reward": env[i], "perplexity": ppl[i], **{c: v[i] for c, v in columns.items()}}
            for i in range(len(texts))]
    return metrics, rows


def _kl_to_base(lm, base_lm, queries, continuations, batch_size: int, shard) -> float:
    """kl_to_reference of `lm`'s own samples against the base model; 0.0 for the base itself."""
    if lm is base_lm:
        return 0.0
    logprobs = {name: response_logprobs(model, query_ids=queries, response_ids=continuations, batch_size=batch_size,
                                        shard=shard) for name, model in (("policy", lm), ("base", base_lm))}
    return kl_to_reference(logprobs["policy"], logprobs["base"])


def evaluate(prompt_rows: list[dict], *, base_dir: str, policy_dir: str, policy_name: str, run_id: str,
             round_: int, seed: int, params: EvaluateParams, task: str = "sentiment",
             score: ScoreParams | None = None, device="cpu") -> tuple[list[dict], list[dict], dict]:
    """The (eval rows, sample rows, metrics) of `evaluate_models` (without its stage metrics)."""
    return evaluate_models(prompt_rows, base_dir=base_dir, policy_dir=policy_dir, policy_name=policy_name,
                           run_id=run_id, round_=round_, seed=seed, params=params, task=task, score=score,
                           device=device)[:3]


def evaluate_models(prompt_rows: list[dict], *, base_dir: str, policy_dir: str, policy_name: str, run_id: str,
                    round_: int, seed: int, params: EvaluateParams, task: str = "sentiment",
                    score: ScoreParams | None = None, device="cpu",
                    shard: Shard | None = None) -> tuple[list[dict], list[dict], dict, dict]:
    """Evaluate the base and the policy on the same prompt sets and seeds, every model on `device`.

    With `shard` (N processes) decoding and perplexity are split by batch and gathered, so every
    process returns what one process would; the scores (cheap next to decoding) are computed by
    every process.

    Params: prompt_rows: the prompts table (its 'eval' rows are the 'world' set); base_dir,
    policy_dir: saved models (the base's tokenizer serves both); params: the evaluate section;
    task: run.task; score: the score section (the training reward; default ScoreParams()).
    Returns: (eval rows: one per policy, set and metric "<set>/<metric>"; sample rows; metrics
    {policy: {set: {metric: value}}} for metrics/eval.json; stage metrics: device (the policy's,
    from its parameters), processes, samples, seconds).
    Raises: DataError for a bad prompts or classifier file (before any model is loaded).
    """
    started = time.perf_counter()
    task_module = get_task(task)  # a task file reads its eval prompt files through its prompt(), with their columns
    sets = load_prompt_sets(params.prompts, prompt_rows, params.n_prompts, getattr(task_module, "eval_prompt_rows", None))
    reward = place(task_module.make_reward(score or ScoreParams()), device)
    evaluator = task_module.make_evaluator(params, reward, seed=seed)
    place(getattr(evaluator, "reward_model", None), device)  # summarization's own RM (the others have no model)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    base_lm = AutoModelForCausalLM.from_pretrained(base_dir).to(device)
    fluency = FluencyLM(params.fluency_model, base_lm, device)
    sample_columns = set(SCHEMAS["eval_samples"].names)
    metrics, sample_rows = {}, []
    for name, model_dir in (("base", base_dir), (policy_name, policy_dir)):
        lm = base_lm if name == "base" else AutoModelForCausalLM.from_pretrained(model_dir).to(device)
        metrics[name] = {}
        for set_name, prompts in sets.items():
            metrics[name][set_name], rows = _score_set(lm, tokenizer, prompts, e=params, seed=seed,
                                                       evaluator=evaluator, reward=reward, fluency=fluency,
                                                       base_lm=base_lm, shard=shard)
            for row in rows:  # prompt_set, positive_prob, perplexity are kept where the schema has them
                row.update(run_id=run_id, round=round_, policy=name, prompt_set=set_name,
                           prompt_id=f"{set_name}/{row['prompt_id']}")
                sample_rows.append({k: v for k, v in row.items() if k in sample_columns})
    eval_rows = [
        {"run_id": run_id, "round": round_, "policy": name, "metric": f"{set_name}/{metric}", "value": float(value),
         "n": by_set[set_name]["n_samples"]}
        for name, by_set in metrics.items() for set_name, values in by_set.items() for metric, value in values.items()
    ]
    info = {"device": module_device(lm), "processes": (shard or Shard()).world_size, "samples": len(sample_rows),
            "seconds": time.perf_counter() - started}
    return eval_rows, sample_rows, metrics, info


def curve_rounds(evaluate: EvaluateParams, rounds: dict, chunks: dict, switch: dict) -> list[int]:
    """The rounds on the held-out eval curve: 0 (the base), every ``evaluate.every``-th round that has a policy
    folder (each of `rounds`; each of `chunks`' last; a switch-over's two sides) and the evaluated policy's."""
    final = int(evaluate.policy.split("=")[1])
    if evaluate.every == 0:
        return []
    if chunks or switch:  # params.rounds lists every round then, but only a stage's last round leaves a policy
        ends = {int(c.last) for c in chunks.values()} | {int(k) for k in switch} | {int(s.last) for s in switch.values()}
    else:
        ends = {int(k) for k in rounds}
    return [0] + sorted(r for r in ends | {final} if r <= final and (r % evaluate.every == 0 or r == final))


def curve_point(round_: int, by_set: dict) -> dict:
    """{"round", "<set>/<metric>": value} of one policy's {set: {metric: value}} (n_samples left out)."""
    return {"round": round_, **{f"{s}/{m}": float(v) for s, values in by_set.items() for m, v in values.items()
                                if m != "n_samples"}}


def evaluate_curve(prompt_rows: list[dict], *, base_dir: str, models_dir: str, rounds: list[int], seed: int,
                   params: EvaluateParams, task: str, score: ScoreParams, device="cpu",
                   shard: Shard | None = None, known: dict[int, dict] | None = None) -> list[dict]:
    """The held-out eval curve: per round, {"round", "<set>/<metric>": value} of that round's policy
    (models_dir/round=NNNN; round 0 = base_dir) on the eval prompt sets, ``evaluate.curve_samples``
    samples per prompt, the same seed for every round (so rounds differ only by their policy).

    known: {round: {set: {metric: value}}} already measured (the stage passes the final eval's base and
    policy, so the curve ends exactly at metrics/eval.json's numbers); those rounds are not sampled again.
    """
    from dataclasses import replace
    from pathlib import Path

    known = known or {}
    points = {r: curve_point(r, known[r]) for r in rounds if r in known}
    rounds = [r for r in rounds if r not in known]
    if not rounds:
        return [points[r] for r in sorted(points)]
    e = replace(params, samples_per_prompt=params.curve_samples)
    task_module = get_task(task)
    sets = load_prompt_sets(e.prompts, prompt_rows, e.n_prompts, getattr(task_module, "eval_prompt_rows", None))
    reward = place(task_module.make_reward(score), device)
    evaluator = task_module.make_evaluator(e, reward, seed=seed)
    place(getattr(evaluator, "reward_model", None), device)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    base_lm = AutoModelForCausalLM.from_pretrained(base_dir).to(device)
    fluency = FluencyLM(e.fluency_model, base_lm, device)
    for round_ in rounds:
        lm = base_lm if round_ == 0 else AutoModelForCausalLM.from_pretrained(
            Path(models_dir) / f"round={round_:04d}").to(device)
        points[round_] = curve_point(round_, {
            set_name: _score_set(lm, tokenizer, prompts, e=e, seed=seed, evaluator=evaluator, reward=reward,
                                 fluency=fluency, base_lm=base_lm, shard=shard)[0] for set_name, prompts in sets.items()})
    return [points[r] for r in sorted(points)]
