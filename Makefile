# Stratagem: `make demo` runs the main job, `make test` runs every check. Both create the virtual
# environment and install what is missing first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Tests start one Ray per session; token authentication is for real clusters, not CI.
export RAY_AUTH_MODE ?= disabled
export RAY_USAGE_STATS_ENABLED ?= 0

.PHONY: demo test lint typecheck imports unit integration e2e proto bench fmt clean help

help:
	@echo "make demo   - start a local Ray, launch the four agents, pursue the built-in goal"
	@echo "make test   - lint, type-check, import contracts, unit + integration + e2e tests"
	@echo "make bench  - benchmarks; JSON in .bench/results.json and a table in BENCHMARKS.md"
	@echo "make proto  - regenerate protocol/_gen/ from proto/"

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/stratagem demo

proto: $(STAMP)
	bash scripts/gen_protos.sh

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

imports: $(STAMP)
	$(BIN)/lint-imports

unit: $(STAMP)
	$(BIN)/pytest -q tests/unit -m "not integration"

test: lint typecheck imports
	$(BIN)/pytest -q -ra

bench: $(STAMP)
	@$(BIN)/python -m tests.bench

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf .stratagem .pytest_cache .mypy_cache .ruff_cache .bench
