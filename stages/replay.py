"""replay: the stages of a DVC replay folder written by `drlc replay --dvc` (docs/replay.md).

`train` re-runs PPO over the source run's recorded rollouts and cached critic answers with the
settings in --params; `evaluate` evaluates the replayed final policy like the `evaluate` stage.
Both run with the replay folder as working folder (--out .) and --from naming the source run.
"""
import argparse

from pipeline.commands.replay_dvc import evaluate_stage, replay_stage
from pipeline.steps import stage


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("step", choices=["train", "evaluate"])
    p.add_argument("--from", dest="run", required=True, help="folder of the finished source run")
    p.add_argument("--params", default="params.yaml", help="the replay settings (default: params.yaml)")
    p.add_argument("--out", default=".", help="the replay folder (default: .)")
    p.add_argument("--allow-new-calls", action="store_true", help="send critic/scorer requests not cached")
    args = p.parse_args()
    if args.step == "train":
        replay_stage(args.run, args.out, params_file=args.params, allow_new_calls=args.allow_new_calls)
    else:
        metrics = evaluate_stage(args.run, args.out, params_file=args.params, allow_new_calls=args.allow_new_calls)
        print(f"evaluate: {', '.join(metrics)} evaluated -> {args.out}/metrics/eval.json")


if __name__ == "__main__":
    stage.run(main)
