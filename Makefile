# tokenmill: `make demo` runs the whole flow on the bundled sample; `make test` runs the test suite.
# Both create .venv and install the project first (once; again when pyproject.toml changes).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup postgres demo test lint format bench faults clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch==2.13.0 (CPU) for megatron-core comes from the machine's local wheel store.
	$(BIN)/python -m pip install -q -e '.[test,megatron]'
	touch $(STAMP)

setup: $(STAMP)

# Debian's PostgreSQL server, for the test that runs a Prefect server on it (skipped where it cannot install).
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; } || \
	  echo "note: PostgreSQL could not be installed; its test will be skipped"

demo: setup
	$(BIN)/tokenmill run examples/demo.yaml

test: setup postgres
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check .

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: setup
	$(BIN)/python bench/tokenize.py
	$(BIN)/python bench/pack.py

# The fault campaign (bench/faults.py): every fault kind, TRIALS trials each, against a clean run; slow (hours
# with 20 trials on 2 shared cores). FAULTS_ARGS adds options, e.g. FAULTS_ARGS="--kinds worker_kill,s3".
TRIALS ?= 20
faults: setup
	$(BIN)/python bench/faults.py --trials $(TRIALS) --report out/faults.json $(FAULTS_ARGS)

clean:
	rm -rf out .pytest_cache .ruff_cache
