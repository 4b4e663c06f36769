"""prepare: the synthetic world's pretraining corpus and the train/eval prompts."""
from pipeline import stage, store
from pipeline.steps.prepare import prepare


def main():
    args = stage.parser(__doc__, "corpus", "prompts").parse_args()
    params = stage.start(args)
    w = params.world
    corpus, prompts = prepare(
        run_id=params.run.run_id, seed=params.run.seed, n_reviews=w.n_reviews,
        n_train_prompts=w.n_train_prompts, n_eval_prompts=w.n_eval_prompts,
        prefix_min_words=w.prefix_min_words, prefix_max_words=w.prefix_max_words,
    )
    store.write_lines(corpus, f"{args.corpus}/reviews.txt")
    store.write_table(prompts, "prompts", args.prompts)


if __name__ == "__main__":
    stage.run(main)
