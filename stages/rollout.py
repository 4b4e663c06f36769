"""rollout: sample one response per chosen train prompt from the round's starting policy.

Data parallel: `accelerate launch --multi_gpu --num_processes N stages/rollout.py ...` (docs/scale-out.md).
rollout.engine vllm: vLLM samples instead (pipeline/steps/engine_rollout.py; its own parallelism).
"""
from pathlib import Path

from pipeline.core import store
from pipeline.core.device import resolve_device
from pipeline.model.vllm_engine import pin_engine_device
from pipeline.parallel.shard import Shard
from pipeline.steps import stage
from pipeline.steps.engine_rollout import engine_rollout_round
from pipeline.steps.rollout import rollout_round


def main():
    args = stage.parser(__doc__, "prompts", "policy", "out", "metrics", with_round=True).parse_args()
    params = pin_engine_device(stage.start(args))  # vllm on cuda:N: that GPU only, before CUDA starts
    device, shard = resolve_device(params.run.device), Shard.from_environment()
    r, prompts, name = params.rollout, store.read_table(args.prompts, "prompts"), Path(args.policy).name
    if r.engine == "vllm":
        rows, metrics = engine_rollout_round(prompts, policy_dir=args.policy, policy_name=name,
                                             run_id=params.run.run_id, round_=int(args.round), seed=params.run.seed,
                                             rollout=r, shard=shard, mixed_precision=params.ppo.mixed_precision)
    else:
        rows, metrics = rollout_round(
            prompts, policy_dir=args.policy, policy_name=name, run_id=params.run.run_id, round_=int(args.round),
            seed=params.run.seed, batch_size=r.batch_size, max_new_tokens=r.max_new_tokens,
            generation_batch_size=r.generation_batch_size, min_new_tokens=r.min_new_tokens, device=device,
            shard=shard, samples_per_prompt=r.samples_per_prompt)
    shard.close()
    if shard.is_main:  # every process holds all rows; one writes them
        store.write_table(rows, "rollouts", args.out)
        stage.write_json(metrics, args.metrics)


if __name__ == "__main__":
    stage.run(main)
