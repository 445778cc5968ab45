# `make demo` and `make test` do all the set-up on a fresh machine: they create
# .venv and install fleetstore and fleetstore-stress (stress/: `fleetstore stress`, a
# distribution of its own) editable with the development tools into it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

AGENTS   ?= 16
DURATION ?= 25
THINK_MS ?= 10

.PHONY: venv demo test soak lint typecheck unit fast check frameworks bench clean readme

venv: $(STAMP)

# The development tools are a dependency group (pyproject.toml [dependency-groups]
# dev, PEP 735), not a published extra: `--group` needs pip 25.1 or newer, which the
# upgrade before it brings.
$(STAMP): pyproject.toml stress/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e . -e ./stress --group dev
	touch $(STAMP)

demo: venv
	$(BIN)/fleetstore stress --compare --agents $(AGENTS) --duration $(DURATION) --think-ms $(THINK_MS) --external-lock 6.5@5 --report /tmp/fleetstore-stress-report.html

lint: venv
	$(BIN)/ruff check src stress tests benchmarks frameworks tools
	$(BIN)/ruff format --check src stress tests benchmarks frameworks tools
	$(BIN)/lint-imports
	$(BIN)/python tools/pypi_readme.py --check

# README.pypi.md (the package's long description) from README.md, links made absolute.
readme: venv
	$(BIN)/python tools/pypi_readme.py

typecheck: venv
	$(BIN)/mypy

# Four pytest workers on 2 cores: the fleet tests spend most of their time waiting
# out outside locks (two of them 70 s) or on a server; the slow ones are scheduled
# first (tests/conftest.py) so that no long test starts last, and handed out two at
# a time (--maxschedchunk 2): by default pytest-xdist gives each worker a first chunk
# of a quarter of its share, so one worker got all 82 slow tests and ran alone for
# 7 of the suite's 15.5 minutes.  Six workers loaded the cores so that `fleetstore
# lock` processes the stress tests start took over 5 s to lock.
PYTEST_N := -n 4 --maxschedchunk 2

# make test is the correctness suite; make soak runs what it leaves out: the real
# fleets (tests marked fleet: many processes, outside locks of 6.5 to 70 s, the
# benchmarks' own runs) and the assertions that must stay bounds on wall-clock time
# (marked timing: a budget honoured, a wake-up within a bound), which a loaded machine
# can upset.  CI runs both (.ci/run).
unit: venv
	$(BIN)/pytest $(PYTEST_N) -m "not fleet and not timing"

test: lint typecheck unit

soak: venv
	$(BIN)/pytest $(PYTEST_N) -m "fleet or timing"

# The fast subset for iterating (under 3 min on 2 cores): the correctness suite less
# the tests marked slow (the heaviest process and CLI tests).
fast: venv
	$(BIN)/pytest $(PYTEST_N) -m "not slow and not fleet and not timing"

check: lint typecheck fast

# The frameworks' own session and checkpointer tests (OpenAI Agents SDK, LangGraph),
# from their released source packages at the versions .venv installs, against
# fleetstore's adapters: frameworks/run.py (downloads into build/frameworks/ once;
# the swap of the store fixture and the expected failures are in frameworks/).
frameworks: venv
	$(BIN)/python frameworks/run.py

bench: venv
	$(BIN)/python benchmarks/bench_engine.py

clean:
	rm -rf $(VENV) build src/*.egg-info stress/build stress/src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
