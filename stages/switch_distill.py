"""switch_distill: the switch-over's tagger, trained on rounds 1..R's read critic answers (switch_critic@R's
rollouts and annotations folders), into models/tagger=R; the tagger side critiques with it (docs/tagger.md).
"""
from pipeline.audit.distill import distill, examples_from_folders
from pipeline.core.errors import ConfigError
from pipeline.critic.templates import load_template
from pipeline.steps import stage
from pipeline.tasks import get_task


def main():
    p = stage.parser(__doc__, "rollouts", "annotations", "out")
    args = p.parse_args()
    params = stage.start(args)
    key = params.switch_round()
    if key is None:
        raise ConfigError("params 'switch' is {} (off): switch_distill runs only with switch: {R: {last: N}}.")
    spec, task = params.switch[key], params.run.task
    labels = load_template(params.critic.template, task=task, labels=params.critic.labels,
                           fields=get_task(task).critic_fields).labels
    examples = examples_from_folders(args.rollouts, args.annotations, labels=labels)
    card = distill(examples, labels=labels, out_dir=args.out, source=f"rounds 0001..{key} ({args.annotations})",
                   seed=spec.seed, heldout_share=spec.heldout_share)
    print(f"switch_distill {key}: a tagger for {card['labels']} from {card['n_train']} answers of rounds 0001..{key} "
          f"into {args.out} (held-out {card['n_heldout']}: char F1 {card['heldout']['char_f1']:.3f}); "
          f"data {card['data_sha256'][:12]}, model {card['model_hash'][:12]}")


if __name__ == "__main__":
    stage.run(main)
