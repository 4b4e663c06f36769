"""base: the model every round starts from (tiny GPT-2 pretrained on the corpus, or base.model), then SFT."""
from pipeline.core import store
from pipeline.core.device import resolve_device
from pipeline.model.folders import check_base_model
from pipeline.steps import stage
from pipeline.steps.base import build_base_model


def main():
    args = stage.parser(__doc__, "corpus", "out", "metrics").parse_args()
    params = stage.start(args, check_base_model)
    device = resolve_device(params.run.device)
    corpus = store.read_lines(f"{args.corpus}/corpus.txt")
    stats = build_base_model(corpus, out_dir=args.out, seed=params.run.seed, base=params.base, device=device)
    stage.write_json(stats, args.metrics)
    losses = ", ".join(f"{k} {v:.3f}" for k, v in stats.items() if k.endswith("loss") or "loss_" in k)
    print(f"base: {stats['source']} in {stats['seconds']:.0f} s" + (f"; {losses}" if losses else ""))


if __name__ == "__main__":
    stage.run(main)
