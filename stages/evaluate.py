"""evaluate: the final policy against the base on each prompt set (DExperts protocol); curves per round."""
from pathlib import Path

from pipeline import stage, store
from pipeline.evaluate.curves import round_curves
from pipeline.steps.evaluate import evaluate


def main():
    args = stage.parser(__doc__, "prompts", "base", "policy", "data", "metrics", "curves", "out",
                        "samples").parse_args()
    params = stage.start(args)
    policy_name = Path(args.policy).name
    rows, samples, metrics = evaluate(
        store.read_table(args.prompts, "prompts"), base_dir=args.base, policy_dir=args.policy,
        policy_name=policy_name, run_id=params.run.run_id, round_=int(policy_name.split("=")[1]),
        seed=params.run.seed, params=params.evaluate, task=params.run.task, score=params.score,
    )
    store.write_table(rows, "eval", args.out)
    store.write_table(samples, "eval_samples", args.samples)
    stage.write_json(metrics, args.metrics)
    stage.write_json({"rounds": round_curves(args.data)}, args.curves)


if __name__ == "__main__":
    stage.run(main)
