"""evaluate: the final policy against the base on each prompt set (DExperts protocol); curves per round;
with --eval-curve, the held-out eval of every evaluate.every-th round (pipeline/steps/evaluate.py evaluate_curve).

Data parallel: `accelerate launch --multi_gpu --num_processes N stages/evaluate.py ...` (docs/scale-out.md).
"""
from pathlib import Path

from pipeline.core import store
from pipeline.core.device import resolve_device
from pipeline.data.inputs import check_eval_prompts
from pipeline.evaluate.curves import round_curves
from pipeline.evaluate.naive_bayes import check_classifier_data
from pipeline.model.folders import check_eval_models
from pipeline.parallel.shard import Shard
from pipeline.steps import stage
from pipeline.steps.evaluate import curve_rounds, evaluate_curve, evaluate_models
from pipeline.tasks import check_params


def main():
    parser = stage.parser(__doc__, "prompts", "base", "policy", "data", "metrics", "curves", "out", "samples")
    parser.add_argument("--stage-metrics", help="JSON of the stage itself: device, samples, seconds")
    parser.add_argument("--eval-curve", help="JSON of the held-out eval every evaluate.every rounds (a DVC plot)")
    parser.add_argument("--models", default="models", help="the folder of the round=NNNN policies (the eval curve)")
    args = parser.parse_args()
    params = stage.start(args, check_params, check_eval_prompts, check_eval_models, check_classifier_data)
    device, shard = resolve_device(params.run.device), Shard.from_environment()
    policy_name = Path(args.policy).name
    rows, samples, metrics, info = evaluate_models(
        store.read_table(args.prompts, "prompts"), base_dir=args.base, policy_dir=args.policy,
        policy_name=policy_name, run_id=params.run.run_id, round_=int(policy_name.split("=")[1]),
        seed=params.run.seed, params=params.evaluate, task=params.run.task, score=params.score, device=device,
        shard=shard,
    )
    curve = [] if not args.eval_curve else evaluate_curve(
        store.read_table(args.prompts, "prompts"), base_dir=args.base, models_dir=args.models,
        rounds=curve_rounds(params.evaluate, params.rounds, params.chunks, params.switch), seed=params.run.seed,
        params=params.evaluate, task=params.run.task, score=params.score, device=device, shard=shard,
        known={0: metrics["base"], int(policy_name.split("=")[1]): metrics[policy_name]})
    shard.close()
    if not shard.is_main:
        return  # every process holds the same results; one writes them
    store.write_table(rows, "eval", args.out)
    store.write_table(samples, "eval_samples", args.samples)
    stage.write_json(metrics, args.metrics)
    stage.write_json({"rounds": round_curves(args.data)}, args.curves)
    if args.eval_curve:
        stage.write_json({"rounds": curve}, args.eval_curve)
    if args.stage_metrics:
        stage.write_json(info, args.stage_metrics)


if __name__ == "__main__":
    stage.run(main)
