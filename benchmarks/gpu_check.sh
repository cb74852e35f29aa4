#!/usr/bin/env bash
# The GPU check (docs/benchmarks.md, "GPU check"). On one GPU where torch with CUDA, transformers, peft,
# pyarrow, rich, tensorboard and pytest are installed and nothing can be downloaded, in under 8 minutes:
#   1. installs the wheels carried in .gpu-carry/wheels (`make gpu-bundle`) into a private target, no index;
#   2. records the machine (nvidia-smi, versions, the imports stratarl needs) in env.txt;
#   3. runs the gpu-marked tests (tests/gpu: GRPO on cuda, bf16 log-prob gap, FSDP2 mixed precision,
#      the memory hand-off, a cuda checkpoint loaded on the CPU);
#   4. runs a bf16 GRPO of a few steps in one process (benchmarks/gpu_check.py) and prints tokens/s and MFU.
# Results in $OUT (else --out DIR, default runs/gpu-check): env.txt, gpu_tests.log, gpu_tests.xml,
# grpo.log, gpu_check.json, summary.json. Exit status 0 only when the tests and the run both passed.
# Without CUDA it runs the same on the CPU, smaller (the dry run): the gpu tests then skip.
#   bash benchmarks/gpu_check.sh [--out DIR] [--python PY] [--steps N] [--model smollm2-shape|tiny|PATH]
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS=${OUT:-runs/gpu-check}
PY=python3
STEPS=""
MODEL=auto
while [ $# -gt 0 ]; do
    case "$1" in
        --out) RESULTS=$2; shift 2 ;;
        --python) PY=$2; shift 2 ;;
        --steps) STEPS=$2; shift 2 ;;
        --model) MODEL=$2; shift 2 ;;
        -h | --help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
mkdir -p "$RESULTS"
SITE=${STRATARL_GPU_SITE:-/tmp/stratarl-site}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false RAY_USAGE_STATS_ENABLED=0
START=$(date +%s)

# 1. the carried wheels, ahead of what the machine has (its transformers may be older than the pin)
if ls .gpu-carry/wheels/*.whl > /dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        .gpu-carry/wheels/*.whl || { echo "gpu_check.sh: installing .gpu-carry/wheels failed" >&2; exit 3; }
    export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
    echo "gpu_check.sh: no .gpu-carry/wheels (make gpu-bundle): using the packages installed here"
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi

# 2. the machine
{
    date -u
    nvidia-smi 2>&1 | head -15
    "$PY" - << 'EOF'
import importlib, platform
import torch
print("python", platform.python_version(), "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "| available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(), "| capability", torch.cuda.get_device_capability())
for name in ("transformers", "tokenizers", "safetensors", "tensordict", "omegaconf", "pyarrow", "rich",
             "peft", "tensorboard", "yaml", "numpy", "pytest", "stratarl"):
    module = importlib.import_module(name)
    print(f"{name} {getattr(module, '__version__', '?')} {module.__file__}")
import stratarl.trainer.rl_trainer  # the one-process path, without ray
EOF
} > "$RESULTS/env.txt" 2>&1
env_rc=$?
cat "$RESULTS/env.txt"
[ $env_rc -eq 0 ] || { echo "gpu_check.sh: the environment check failed (env.txt)" >&2; exit 4; }
CUDA=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))")

# 3. the gpu tests
timeout 240 "$PY" -m pytest -q -rs -m gpu tests/gpu -p no:cacheprovider --junitxml="$RESULTS/gpu_tests.xml" \
    > "$RESULTS/gpu_tests.log" 2>&1
tests_rc=$?
tail -n 20 "$RESULTS/gpu_tests.log"

# 4. a bf16 GRPO of a few steps in one process
if [ "$CUDA" = 1 ]; then
    size=(--steps "${STEPS:-5}" --model "$MODEL")
else  # the dry run: the same code on the CPU, small
    size=(--device cpu --steps "${STEPS:-2}" --model "$([ "$MODEL" = auto ] && echo tiny || echo "$MODEL")"
          --prompts 4 --n 2 --max-response-tokens 16)
fi
timeout 240 "$PY" benchmarks/gpu_check.py --out /tmp/stratarl-gpu-check --json "$RESULTS/gpu_check.json" \
    "${size[@]}" > "$RESULTS/grpo.log" 2>&1
grpo_rc=$?
grep -E "^GRPO on|Error|error:" "$RESULTS/grpo.log" | tail -n 5

cat > "$RESULTS/summary.json" << EOF
{"cuda": $CUDA, "gpu_tests_exit": $tests_rc, "grpo_exit": $grpo_rc, "seconds": $(($(date +%s) - START))}
EOF
cat "$RESULTS/summary.json"
[ $tests_rc -eq 0 ] && [ $grpo_rc -eq 0 ]
