"""`evaluate` stage: sample continuations of the eval prompts from the base and the final policy
and compute the task's metrics (sentiment: env reward, positive share, dist-n, perplexity)."""
from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipeline.evaluate.metrics import conditional_perplexities, distinct_n, positive_share
from pipeline.rewards.sentiment import VaderReward


@torch.no_grad()
def sample_continuations(lm, tokenizer, queries: list[list[int]], *, max_new_tokens: int, top_p: float,
                         seed: int) -> list[list[int]]:
    """Nucleus samples (top_k off), one per query, left-padded batch; EOS ends a continuation."""
    torch.manual_seed(seed)
    lm.eval()
    width = max(len(q) for q in queries)
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(q)) + q for q in queries])  # (B, Tq)
    mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(q) for q in queries])[:, None]).long()
    out = lm.generate(input_ids=ids, attention_mask=mask, do_sample=True, top_p=top_p, top_k=0,
                      max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                      eos_token_id=tokenizer.eos_token_id)[:, width:]  # (B, <=max_new_tokens)
    continuations = []
    for row in out.tolist():
        ids_ = [t for t in row if t != tokenizer.pad_token_id]
        if tokenizer.eos_token_id in ids_:
            ids_ = ids_[: ids_.index(tokenizer.eos_token_id)]
        continuations.append(ids_)
    return continuations


def evaluate(prompt_rows: list[dict], *, base_dir: str, policy_dir: str, policy_name: str, run_id: str,
             round_: int, seed: int, n_prompts: int, samples_per_prompt: int, max_new_tokens: int,
             top_p: float) -> tuple[list[dict], list[dict], dict]:
    """Evaluate base and policy on the same eval prompts and seeds.

    Returns (eval rows: one per policy and metric, sample rows, metrics {policy: {metric: value}}).
    Perplexity is measured under the base model for both policies.
    """
    prompts = [row for row in prompt_rows if row["split"] == "eval"][:n_prompts]
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    base_lm = AutoModelForCausalLM.from_pretrained(base_dir)
    queries = [[tokenizer.bos_token_id] + tokenizer.encode(p["text"]) for p in prompts for _ in range(samples_per_prompt)]
    reward = VaderReward()
    metrics, sample_rows = {}, []
    for name, model_dir in (("base", base_dir), (policy_name, policy_dir)):
        lm = base_lm if model_dir == base_dir else AutoModelForCausalLM.from_pretrained(model_dir)
        continuations = sample_continuations(lm, tokenizer, queries, max_new_tokens=max_new_tokens,
                                             top_p=top_p, seed=seed)
        texts = [tokenizer.decode(c, skip_special_tokens=True) for c in continuations]
        scores = reward.score(texts)
        per_prompt = [texts[i:i + samples_per_prompt] for i in range(0, len(texts), samples_per_prompt)]
        ppl = [p for p in conditional_perplexities(base_lm, query_ids=queries, response_ids=continuations) if p == p]
        metrics[name] = {
            "env_reward_mean": sum(scores) / len(scores), "positive_share": positive_share(scores),
            "dist_1": distinct_n(per_prompt, 1), "dist_2": distinct_n(per_prompt, 2),
            "dist_3": distinct_n(per_prompt, 3), "perplexity": sum(ppl) / max(len(ppl), 1),
        }
        sample_rows += [
            {"run_id": run_id, "round": round_, "policy": name, "prompt_id": prompts[i // samples_per_prompt]["prompt_id"],
             "sample": i % samples_per_prompt, "query": prompts[i // samples_per_prompt]["text"],
             "response": text, "env_reward": s}
            for i, (text, s) in enumerate(zip(texts, scores))
        ]
    eval_rows = [
        {"run_id": run_id, "round": round_, "policy": name, "metric": metric, "value": value, "n": len(queries)}
        for name, values in metrics.items() for metric, value in values.items()
    ]
    return eval_rows, sample_rows, metrics
