"""switch: one side of the switch-over (params 'switch'): rounds 1..R with the configured critic (--side critic),
or rounds R+1..last with the tagger trained on them (--side tagger --tagger models/tagger=R), in one process.

Writes every round's partitions under <data>/<table>/chunk=<side>/ and metrics under
<metrics>/<rollout|score|critique|ppo>/chunk=<side>/, then the side's last checkpoint (pipeline/steps/switch.py).
"""
from pipeline.core import store
from pipeline.core.device import resolve_device
from pipeline.model.vllm_engine import pin_engine_device
from pipeline.steps import stage
from pipeline.steps.preflight import check_inputs
from pipeline.steps.switch import SIDES, run_side, side_params


def main():
    parser = stage.parser(__doc__, "prompts", "policy", "reference", "data", "metrics", "out")
    parser.add_argument("--side", required=True, choices=SIDES, help="critic: rounds 1..R; tagger: rounds R+1..last")
    parser.add_argument("--tagger", help="the tagger side's critic: the model folder switch_distill@R writes")
    args = parser.parse_args()
    params = side_params(stage.start(args), args.side, args.tagger)  # the tagger side: critic = the tagger
    params = pin_engine_device(params)  # vllm on cuda:N: that GPU only, before CUDA starts
    check_inputs(params)
    run_side(store.read_table(args.prompts, "prompts"), params=params, side=args.side, policy_dir=args.policy,
             reference_dir=args.reference, out_dir=args.out, data_dir=args.data, metrics_dir=args.metrics,
             device=resolve_device(params.run.device))


if __name__ == "__main__":
    stage.run(main)
