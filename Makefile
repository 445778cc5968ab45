# `make demo` and `make test` do all the set-up on a fresh machine: they create
# .venv and install fleetstore with its development tools into it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

AGENTS   ?= 16
DURATION ?= 20
THINK_MS ?= 10

.PHONY: venv demo test lint typecheck unit bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: venv
	$(BIN)/fleetstore stress --agents $(AGENTS) --duration $(DURATION) --think-ms $(THINK_MS) --external-lock 6.5@5

lint: venv
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck: venv
	$(BIN)/mypy

# Two pytest workers: the fleet tests spend most of their time waiting out outside
# locks (two of them 70 s), so two at once roughly halve the wall time on 2 cores.
unit: venv
	$(BIN)/pytest -n 2

test: lint typecheck unit

bench: venv
	$(BIN)/python benchmarks/bench_engine.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
