"""ppo: one round of PPO on the round's rollouts with env + intrinsic (critic) rewards.

Data parallel: `accelerate launch --multi_gpu --num_processes N stages/ppo.py ...` (docs/ppo.md).
"""
from pipeline.core import store
from pipeline.core.device import resolve_device
from pipeline.parallel.distributed import is_main_process
from pipeline.steps import stage
from pipeline.steps.ppo_round import ppo_round, summarize


def main():
    args = stage.parser(__doc__, "policy", "reference", "rollouts", "scores", "annotations", "out",
                        "steps", "kl-rewards", "metrics", with_round=True).parse_args()
    params = stage.start(args)
    device = resolve_device(params.run.device)  # under accelerate: this rank's GPU, as accelerator.device
    kl_rewards = []
    steps = ppo_round(
        store.read_table(args.rollouts, "rollouts"), store.read_table(args.scores, "scores"),
        store.read_table(args.annotations, "annotations"), policy_dir=args.policy,
        reference_dir=args.reference, out_dir=args.out, params=params.ppo,
        run_id=params.run.run_id, round_=int(args.round), seed=params.run.seed, base=params.base, device=device,
        kl_rewards=kl_rewards,
    )
    if not is_main_process():
        return  # every process computed the same rows; the main one writes them
    store.write_table(steps, "ppo_steps", args.steps)
    store.write_table(kl_rewards, "kl_rewards", args.kl_rewards)
    stage.write_json({**summarize(steps), "device": str(device)}, args.metrics)


if __name__ == "__main__":
    stage.run(main)
