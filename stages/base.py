"""base: train the tokenizer and pretrain the tiny GPT-2 on the world's corpus."""
from pipeline import stage, store
from pipeline.steps.base_model import build_base_model


def main():
    args = stage.parser(__doc__, "corpus", "out").parse_args()
    params = stage.start(args)
    b = params.base
    corpus = store.read_lines(f"{args.corpus}/corpus.txt")
    stats = build_base_model(
        corpus, out_dir=args.out, seed=params.run.seed, vocab_size=b.vocab_size, n_layer=b.n_layer,
        n_head=b.n_head, n_embd=b.n_embd, block_size=b.block_size, steps=b.steps,
        batch_size=b.batch_size, learning_rate=b.learning_rate,
    )
    print(f"base: final loss {stats['final_loss']:.3f} after {stats['steps']} steps")


if __name__ == "__main__":
    stage.run(main)
