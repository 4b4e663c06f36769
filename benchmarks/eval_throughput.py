"""Evaluation throughput on the demo-sized model: samples per second, end to end and by phase.

Model: the demo base shape (params.yaml `base`: GPT-2 2 layers x 128, 4 heads, BPE vocab 1024
trained on the synthetic world), random weights, so no sample stops early at EOS: every
continuation is max_new_tokens (20) long, the worst case. Work: the demo evaluation, world eval
prompts x samples_per_prompt, for base and policy (the same folder twice), as the evaluate
stage runs it (pipeline.steps.evaluate.evaluate), after one warm-up call. Phases are timed
apart on the same queries: decoding, perplexity, classifier, VADER.

Usage:  python benchmarks/eval_throughput.py [--n-prompts 64] [--samples-per-prompt 25] [--threads 1]
Writes benchmarks/results/eval_throughput.json (sorted keys).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_demo_model(out_dir: Path, params) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    from pipeline.data.world import generate_reviews
    from pipeline.model.pretrain import train_tokenizer

    tokenizer = train_tokenizer(generate_reviews(2000, seed=0), vocab_size=params.base.vocab_size, out_dir=out_dir)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=params.base.block_size, n_layer=params.base.n_layer,
                        n_head=params.base.n_head, n_embd=params.base.n_embd,
                        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    GPT2LMHeadModel(config).save_pretrained(out_dir)


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-prompts", type=int, default=64)
    ap.add_argument("--samples-per-prompt", type=int, default=25)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "eval_throughput.json"))
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.core.config import load_params
    from pipeline.data.world import review_prefixes
    from pipeline.evaluate.decode import sample_continuations
    from pipeline.evaluate.metrics import conditional_perplexities
    from pipeline.evaluate.naive_bayes import train_sentiment_classifier
    from pipeline.rewards.sentiment import VaderReward
    from pipeline.steps.evaluate import evaluate

    torch.set_num_threads(args.threads)
    params = load_params(ROOT / "params.yaml")
    e = dataclasses.replace(params.evaluate, prompts=["world"], n_prompts=args.n_prompts,
                            samples_per_prompt=args.samples_per_prompt)
    prompts = [{"prompt_id": str(i), "split": "eval", "text": t}
               for i, t in enumerate(review_prefixes(args.n_prompts, seed=1))]
    with tempfile.TemporaryDirectory() as tmp:
        build_demo_model(Path(tmp), params)
        run = lambda: evaluate(prompts, base_dir=tmp, policy_dir=tmp, policy_name="round=0001", run_id="bench",
                               round_=1, seed=0, params=e)
        run()  # warm-up
        (_, samples, _), end_to_end_s = timed(run)
        tokenizer, lm = AutoTokenizer.from_pretrained(tmp), AutoModelForCausalLM.from_pretrained(tmp)
        queries = [[tokenizer.bos_token_id] + tokenizer.encode(p["text"]) for p in prompts
                   for _ in range(args.samples_per_prompt)]
        conts, decode_s = timed(lambda: sample_continuations(lm, tokenizer, queries, max_new_tokens=e.max_new_tokens,
                                                             top_p=e.top_p, seed=0, batch_size=e.batch_size))
        _, ppl_s = timed(lambda: conditional_perplexities(lm, query_ids=queries, response_ids=conts,
                                                          batch_size=e.batch_size))
        texts = [tokenizer.decode(c, skip_special_tokens=True) for c in conts]
        classifier, train_s = timed(lambda: train_sentiment_classifier("world", seed=0))
        _, classify_s = timed(lambda: classifier.predict_proba(texts))
        _, vader_s = timed(lambda: VaderReward().score(texts))
    n = len(queries)
    result = {
        "settings": {"n_prompts": args.n_prompts, "samples_per_prompt": args.samples_per_prompt,
                     "max_new_tokens": e.max_new_tokens, "top_p": e.top_p, "batch_size": e.batch_size,
                     "threads": args.threads, "model": f"gpt2 {params.base.n_layer}x{params.base.n_embd}, "
                     f"vocab {len(tokenizer)}, random weights (no early EOS)"},
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "cpu": platform.processor()},
        "end_to_end": {"samples": len(samples), "seconds": round(end_to_end_s, 3),
                       "samples_per_s": round(len(samples) / end_to_end_s, 1)},
        "phases_samples_per_s": {"decode": round(n / decode_s, 1), "perplexity": round(n / ppl_s, 1),
                                 "classifier": round(n / classify_s, 1), "vader": round(n / vader_s, 1)},
        "classifier_train_s": round(train_s, 3),
        "mean_continuation_tokens": round(sum(map(len, conts)) / n, 2),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(json.dumps(result, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
