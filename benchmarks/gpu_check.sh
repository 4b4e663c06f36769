#!/usr/bin/env bash
# The GPU check of drlc, one command on a CUDA machine (one H100-class GPU: about 8 minutes):
#
#   bash benchmarks/gpu_check.sh                         # writes benchmarks/results/gpu_check.json
#   TRL_VENV=/tmp/trl-venv bash benchmarks/gpu_check.sh  # also times legacy TRL 0.11 PPOTrainer.step
#   GPU_CHECK_SKIP_INSTALL=1 bash benchmarks/gpu_check.sh   # packages already installed by hand
#   GPU_CHECK_WHEELHOUSE=benchmarks/wheelhouse bash benchmarks/gpu_check.sh   # offline, from the wheels
#                                                        # benchmarks/gpu_wheelhouse.sh downloaded
#
# It installs what the README's test command installs, but keeps the CUDA torch already there:
# constraints.txt pins torch==2.13.0, which pip would meet by replacing any other torch version
# with the PyPI wheel (benchmarks/gpu_check.py, install_commands, says how). Then it runs the demo
# pipeline on the GPU, times a gpt2-large-shaped PPO round (drlc, the bare floor, TRL if given) and,
# with 2+ GPUs, checks DDP / FSDP2 / ZeRO-3 against one process. Every step has a timeout; the
# JSON records each step's status (ok, failed with the reason, skipped with why) and seconds.
# Exit code 1 when a step failed. Extra arguments go to benchmarks/gpu_check.py (--help).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
args=()
if [ -n "${GPU_CHECK_SKIP_INSTALL:-}" ]; then args+=(--skip-install); fi
if [ -n "${TRL_VENV:-}" ]; then args+=(--trl-venv "$TRL_VENV"); fi
# the Python part keeps its own 480 s budget; this outer limit only stops a hung interpreter
timeout 600 "$PYTHON" benchmarks/gpu_check.py "${args[@]}" "$@"
status=$?
if [ "$status" -eq 124 ]; then echo "gpu_check.sh: stopped after 600 s (benchmarks/gpu_check.py hung)" >&2; fi
exit "$status"
