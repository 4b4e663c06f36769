"""chunk: rounds `--chunk`..its `last` (params 'chunks') in one process, models kept in memory.

Writes every round's partitions under <data>/<table>/chunk=KEY/ and metrics under
<metrics>/<rollout|score|critique|ppo>/chunk=KEY/, then the last round's checkpoint (pipeline/steps/chunk.py).
"""
from pipeline.core import store
from pipeline.core.device import resolve_device
from pipeline.model.vllm_engine import pin_engine_device
from pipeline.steps import stage
from pipeline.steps.chunk import run_chunk
from pipeline.steps.preflight import check_inputs


def main():
    parser = stage.parser(__doc__, "prompts", "policy", "reference", "data", "metrics", "out")
    parser.add_argument("--chunk", required=True, help="chunk key from params.yaml 'chunks', e.g. 0001")
    args = parser.parse_args()
    params = pin_engine_device(stage.start(args))  # vllm on cuda:N: that GPU only, before CUDA starts
    check_inputs(params)
    run_chunk(store.read_table(args.prompts, "prompts"), params=params, chunk=args.chunk, policy_dir=args.policy,
              reference_dir=args.reference, out_dir=args.out, data_dir=args.data, metrics_dir=args.metrics,
              device=resolve_device(params.run.device))


if __name__ == "__main__":
    stage.run(main)
