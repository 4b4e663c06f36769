"""critique: send low-reward responses to the critic (through the cache); store the per-token intrinsic rewards.

Exits 2 with one line, writing nothing, when the round fails critic.max_error_rate or its budget.
"""
from pipeline.core import store
from pipeline.core.device import check_device
from pipeline.steps import stage
from pipeline.steps.critique import critic_device, critique
from pipeline.steps.preflight import check_inputs


def main():
    parser = stage.parser(__doc__, "rollouts", "scores", "tokenizer", "out", "metrics", with_round=True)
    parser.add_argument("--prompts", help="prompts table, whose columns a rule critic (critic.backend rules) reads")
    args = parser.parse_args()
    params = stage.start(args, check_inputs, check_device)
    rows, metrics = critique(
        store.read_table(args.rollouts, "rollouts"), store.read_table(args.scores, "scores"),
        critic=params.critic, tokenizer_dir=args.tokenizer, run_id=params.run.run_id,
        round_=int(args.round), task=params.run.task, device=critic_device(params.critic, params.run.device),
        prompt_rows=store.read_table(args.prompts, "prompts") if args.prompts else None,
    )
    store.write_table(rows, "annotations", args.out)
    stage.write_json(metrics, args.metrics)
    print(f"critique: {metrics['critiqued']} critiqued, {metrics['critic_requests']} requests sent "
          f"({metrics['critic_retries']} retries, {metrics['critic_failures']} failed), "
          f"{metrics['cache_hits']} cache hits, ${metrics['critic_cost_usd']:.4f}")


if __name__ == "__main__":
    stage.run(main)
