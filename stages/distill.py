"""distill: train the span tagger `distill.<key>` names on its labelled span file, into critics/<key>.

A run whose critic is that tagger sets critic.backend: tagger and critic.model_dir: critics/<key>;
the critique stages depend on the whole `critics` folder, so they re-run when the model changes.
"""
from pipeline.audit.distill import distill, examples_from_file
from pipeline.core.errors import ConfigError
from pipeline.critic.templates import load_template
from pipeline.steps import stage
from pipeline.tasks import get_task


def main():
    p = stage.parser(__doc__, "out")
    p.add_argument("--key", required=True, help="the distill key in params.yaml, e.g. semeval")
    args = p.parse_args()
    params = stage.start(args)
    if args.key not in params.distill:
        raise ConfigError(f"--key {args.key!r} is not in params 'distill': {sorted(params.distill)}.")
    spec = params.distill[args.key]
    task = params.run.task
    labels = load_template(params.critic.template, task=task, labels=params.critic.labels,
                           fields=get_task(task).critic_fields).labels
    card = distill(examples_from_file(spec.spans, labels=labels), labels=labels, out_dir=args.out,
                   source=spec.spans, seed=spec.seed, heldout_share=spec.heldout_share)
    print(f"distill {args.key}: a tagger for {card['labels']} from {card['n_train']} texts into {args.out} "
          f"(held-out {card['n_heldout']}: char F1 {card['heldout']['char_f1']:.3f}); "
          f"data {card['data_sha256'][:12]}, model {card['model_hash'][:12]}")


if __name__ == "__main__":
    stage.run(main)
