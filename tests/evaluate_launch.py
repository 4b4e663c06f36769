"""Run by tests/test_data_parallel_sampling.py, alone or under `accelerate launch`: evaluate a tiny
base against itself with the processes splitting the batches; rank 0 writes what it got as JSON.

Usage: python tests/evaluate_launch.py MODEL_DIR OUT_JSON
"""
import json
import math
import sys

from pipeline.core.config import EvaluateParams
from pipeline.parallel.shard import Shard
from pipeline.steps.evaluate import evaluate_models

PROMPTS = [{"prompt_id": f"p{i}", "split": "eval", "text": text, "reference": ""}
           for i, text in enumerate(["a good film", "the film was", "a bad", "long and good", "the"])]


def main(model_dir: str, out: str) -> None:
    shard = Shard.from_environment()
    params = EvaluateParams(policy="round=0001", n_prompts=5, samples_per_prompt=3, max_new_tokens=5, batch_size=4)
    _, samples, metrics, info = evaluate_models(PROMPTS, base_dir=model_dir, policy_dir=model_dir,
                                                policy_name="round=0001", run_id="t", round_=1, seed=7,
                                                params=params, shard=shard)
    shard.close()
    if shard.is_main:
        clean = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()} for row in samples]
        with open(out, "w") as f:
            json.dump({"samples": clean, "metrics": metrics, "processes": info["processes"]}, f, sort_keys=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
