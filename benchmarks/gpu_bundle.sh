#!/usr/bin/env bash
# Prepares what benchmarks/gpu_check.sh needs on a GPU machine that cannot download (`make gpu-bundle`),
# in .gpu-carry/ (git-ignored), small enough to travel beside the checkout (64 MiB with it):
#   wheels/         the pinned pure-Python wheels that such a machine lacks (its image holds torch,
#                   transformers, peft, pyarrow, rich, tensorboard, pytest and their needs): transformers
#                   at this project's pin (constraints.txt), tensordict + pyvers, omegaconf + antlr4
#                   (4.9.3 has no wheel on PyPI: built here from its sdist). Not ray (79 MB): the check
#                   runs in one process, and nothing on the in-process path imports ray.
#   smollm2-shape/  SmolLM2-135M's config.json and its real tokenizer (no weights), from the model
#                   `make real-model` imports; the check random-initialises that shape there. The
#                   dequantized weights (~540 MB fp32) and the GGUF wheel (93 MB) are too big to travel.
# Usage: bash benchmarks/gpu_bundle.sh [PYTHON]   (PYTHON: the interpreter whose pip downloads; python3)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-python3}
CARRY=.gpu-carry
WHEELS=$CARRY/wheels
LIMIT_MIB=60  # of the 64 MiB that travel: the checkout itself takes the rest
pin() { sed -n "s/^$1==//p" constraints.txt; }
PINNED=("transformers==$(pin transformers)" "tensordict==$(pin tensordict)" "omegaconf==$(pin omegaconf)"
        "pyvers==0.2.3")
rm -rf "$WHEELS" && mkdir -p "$WHEELS"
# The GPU machine's Python is 3.12 on x86-64; these wheels are pure Python (py3-none-any).
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d "$WHEELS" "${PINNED[@]}"
"$PY" -m pip wheel -q --no-deps -w "$WHEELS" antlr4-python3-runtime==4.9.3  # omegaconf 2.3 pins 4.9.*
REAL=.models/SmolLM2-135M-Instruct
if [ -f "$REAL/config.json" ]; then
    rm -rf "$CARRY/smollm2-shape" && mkdir -p "$CARRY/smollm2-shape"
    for f in config.json generation_config.json tokenizer.json tokenizer_config.json special_tokens_map.json \
             chat_template.jinja; do
        [ -f "$REAL/$f" ] && cp "$REAL/$f" "$CARRY/smollm2-shape/"
    done
else
    echo "note: $REAL is missing (make real-model): the check will use the tiny factory model" >&2
fi
size_kib=$(du -sk "$CARRY" | cut -f1)
echo "$CARRY: $((size_kib / 1024)) MiB"; ls -l "$WHEELS"
if [ "$size_kib" -gt $((LIMIT_MIB * 1024)) ]; then
    echo "error: $CARRY is over $LIMIT_MIB MiB: it would not travel with the checkout" >&2
    exit 1
fi
