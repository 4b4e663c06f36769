"""prepare: the task's pretraining corpus and the train/eval prompts (synthetic world or local data)."""
from pipeline.core import store
from pipeline.data.inputs import check_world_source
from pipeline.model.folders import check_base_model
from pipeline.steps import stage
from pipeline.steps.prepare import prepare
from pipeline.tasks import check_params


def main():
    args = stage.parser(__doc__, "corpus", "prompts").parse_args()
    params = stage.start(args, check_params, check_world_source, check_base_model)
    corpus, prompts = prepare(task=params.run.task, run_id=params.run.run_id, seed=params.run.seed,
                              world=params.world, base_model=params.base.model, pad_token=params.base.pad_token)
    store.write_lines(corpus, f"{args.corpus}/corpus.txt")
    store.write_table(prompts, "prompts", args.prompts)


if __name__ == "__main__":
    stage.run(main)
