"""score: the environment reward of every response of the round."""
from pipeline import stage, store
from pipeline.steps.score import score


def main():
    args = stage.parser(__doc__, "rollouts", "out", with_round=True).parse_args()
    params = stage.start(args)
    rows = score(
        store.read_table(args.rollouts, "rollouts"), run_id=params.run.run_id, round_=int(args.round),
        scorer=params.score.scorer, scale=params.score.scale,
    )
    store.write_table(rows, "scores", args.out)


if __name__ == "__main__":
    stage.run(main)
