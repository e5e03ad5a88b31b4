# The two commands a fresh machine needs: `make run` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck pytest clean

$(STAMP): pyproject.toml scripts/ensure-llama-server scripts/llama-cpp-only-llmgw.cmake scripts/ensure-chromium
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet ninja cmake
	$(BIN)/pip install --quiet -e '.[test]'
	PATH="$(CURDIR)/$(BIN):$$PATH" scripts/ensure-llama-server $(VENV)
	scripts/ensure-chromium
	scripts/ensure-nftables
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/llmgw up

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
