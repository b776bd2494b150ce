# tokenmill: `make demo` runs the whole flow on the bundled sample; `make test` runs the test suite.
# Both create .venv and install what they need first (once; again when pyproject.toml changes): the demo
# tokenmill alone, as `pip install tokenmill` does; the tests also the test tools and megatron-core (torch).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
DEMO_STAMP := $(VENV)/.installed-demo
TEST_STAMP := $(VENV)/.installed-test

.PHONY: setup compiled postgres chromium slurm demo test docs lint format bench faults slow trainers trainer-venvs trainer-tests clean

$(DEMO_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	touch $(DEMO_STAMP)

$(TEST_STAMP): $(DEMO_STAMP)
	# torch==2.13.0 (CPU) for megatron-core comes from the machine's local wheel store.
	$(BIN)/python -m pip install -q -e '.[test,megatron]'
	touch $(TEST_STAMP)

setup: $(TEST_STAMP)

# The project's modules compiled to bytecode, as pip does when it installs a wheel: where PYTHONDONTWRITEBYTECODE
# is set (many container images; this machine) an editable install's modules were compiled again by each process
# of every run: 0.45 s of a 12 MB run's CPU, 0.2 s of its wall. Quick when nothing changed since. The packages are
# pyproject.toml's (bench/megatron.py reads them from there for each checkout it compiles).
compiled: $(DEMO_STAMP)
	@$(BIN)/python -m compileall -q tokenmill tasks flows

# Debian's PostgreSQL server, for the test that runs a Prefect server on it (skipped where it cannot install).
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; } || \
	  echo "note: PostgreSQL could not be installed; its test will be skipped"

# Debian's Chromium, for the tests that drive the Prefect UI and the Dask dashboard in a real browser
# (Playwright's own browser download is not used; skipped where it cannot install).
chromium:
	@test -x /usr/bin/chromium || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "note: Chromium could not be installed; the browser tests will be skipped"

# Debian's SLURM (slurmctld, slurmd) and munge, for the tests whose workers are SLURM jobs (tests/test_slurm.py
# starts its own daemons with their own config; skipped where they cannot install).
slurm:
	@test -x /usr/sbin/slurmctld -a -x /usr/sbin/munged || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null; } || \
	  echo "note: SLURM could not be installed; its tests will be skipped"

demo: compiled
	$(BIN)/tokenmill run examples/demo.yaml

# The whole suite: ruff, pytest, then the trainers' loader tests in their own venvs (see `trainers` below).
test: setup compiled postgres chromium slurm trainer-venvs
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest
	$(MAKE) --no-print-directory trainer-tests

# The docs site (mkdocs.yml, docs/) into site/; strict: a broken link or anchor fails. docs/configuration.md is
# generated: python -m tokenmill.commands.config_reference > docs/configuration.md
docs: setup
	$(BIN)/mkdocs build --strict

lint: setup
	$(BIN)/ruff check .

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: setup
	$(BIN)/python bench/throughput.py
	$(BIN)/python bench/pack.py

# The fault campaign (bench/faults.py): every fault kind, TRIALS trials each, against a clean run; slow (hours
# with 20 trials on 2 shared cores). FAULTS_ARGS adds options, e.g. FAULTS_ARGS="--kinds worker_kill,s3".
TRIALS ?= 20
faults: setup
	$(BIN)/python bench/faults.py --trials $(TRIALS) --report out/faults.json $(FAULTS_ARGS)

# The slow tests, not in the suite (marked slow): links cut across hosts (tests/test_hosts.py: the S3 server, the
# scheduler, two workers and the flow on network namespaces of their own, a worker's or the scheduler's link cut
# mid-run, for a while and for good, each faulted run and its rerun against a clean run's bytes), SLURM worker
# jobs reaching their walltime (tests/test_slurm.py), and one trial of every kind of the fault campaign
# (tests/test_fault_campaign.py). Root; about 20 minutes, one test at a time.
slow: setup slurm
	$(BIN)/python -m pytest -m slow -n 0

# The trainers that cannot share the test venv (marked trainers): OLMo-core (ai2-olmo-core) wants a
# huggingface-hub older than transformers 5's; litdata wants torchvision, for which pip would fetch a CUDA torch
# 2.14 unless torch and torchvision are pinned (PyPI's torchvision 0.28.0 is a CUDA build that litdata never imports).
# Their venv sees the test venv's packages (torch among them) through a .pth, behind its own; the tokenmill runs its
# tests make are the test venv's. MosaicML streaming (marked streaming) pins numpy<2.2 and transformers<5, which
# break datasets 5: a venv of its own, without torchvision (the tests stand in for the two names it imports).
# `make test` runs these too (once their venvs exist: installed once, again when pyproject.toml changes).
TRAINERS := .venv-trainers
STREAMING := .venv-streaming
TRAINERS_STAMP := $(STREAMING)/.installed
$(TRAINERS_STAMP): $(TEST_STAMP)
	for venv in $(TRAINERS) $(STREAMING); do \
	  test -x $$venv/bin/python || $(PYTHON) -m venv $$venv; \
	  echo "$(abspath $(VENV))/lib/python3.11/site-packages" > $$venv/lib/python3.11/site-packages/zz_tokenmill.pth; \
	  printf 'torch==2.13.0\ntorchvision==0.28.0\n' > $$venv/constraints.txt; \
	  for command in tokenmill prefect dask; do ln -sf $(abspath $(BIN))/$$command $$venv/bin/$$command; done; \
	done
	$(TRAINERS)/bin/python -m pip install -q -c $(TRAINERS)/constraints.txt "ai2-olmo-core>=3.0" "litdata>=0.2.76"
	$(STREAMING)/bin/python -m pip install -q -c $(STREAMING)/constraints.txt "mosaicml-streaming>=0.13"
	$(STREAMING)/bin/python -m pip uninstall -q -y torchvision
	touch $(TRAINERS_STAMP)

trainer-venvs: $(TRAINERS_STAMP)

trainer-tests:
	$(TRAINERS)/bin/python -m pytest -m trainers -n 0 tests/test_chat_trainers.py tests/test_formats_trainers.py
	$(STREAMING)/bin/python -m pytest -m streaming -n 0 tests/test_formats_trainers.py

trainers: trainer-venvs trainer-tests

clean:
	rm -rf out site .pytest_cache .ruff_cache
