"""score: the environment reward of every response of the round (pipeline/rewards/<task>.py)."""
from pipeline.core import store
from pipeline.core.device import check_device
from pipeline.data.inputs import check_score_data
from pipeline.steps import stage
from pipeline.steps.score import check_score_model, score_round, scorer_device
from pipeline.tasks import check_params


def main():
    parser = stage.parser(__doc__, "rollouts", "out", "metrics", with_round=True)
    parser.add_argument("--prompts", help="prompts table with each prompt's reference (needed by summarization)")
    args = parser.parse_args()
    params = stage.start(args, check_params, check_score_data, check_score_model, check_device)
    rows, metrics = score_round(
        store.read_table(args.rollouts, "rollouts"),
        store.read_table(args.prompts, "prompts") if args.prompts else None,
        task=params.run.task, run_id=params.run.run_id, round_=int(args.round), params=params.score,
        device=scorer_device(params.score, task=params.run.task, setting=params.run.device),
    )
    store.write_table(rows, "scores", args.out)
    stage.write_json(metrics, args.metrics)


if __name__ == "__main__":
    stage.run(main)
