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

.PHONY: setup demo test test-slow lint format clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned: an unpinned torch would fetch a multi-GB CUDA build.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m stratarl quickstart

test: $(STAMP)
	$(PY) -m pytest -q

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

lint: $(STAMP)
	$(PY) -m ruff check stratarl tests benchmarks
	$(PY) -m ruff format --check stratarl tests benchmarks

format: $(STAMP)
	$(PY) -m ruff check --fix stratarl tests benchmarks
	$(PY) -m ruff format stratarl tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
