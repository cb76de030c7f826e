# Stratagem: `make demo` runs the main job, `make test` runs every check. Both create the virtual
# environment and install what is missing first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-runtime
# The web console's scripts, pinned by package-lock.json, installed with npm ci and copied into the
# package (runtime/_console/static/vendor/, gitignored). `make demo` goes on without npm (the
# console then says what is missing); `make test` needs them (the browser tests use them).
CONSOLE_ASSETS := runtime/_console/static/vendor/.installed
# Tests start one Ray per session; token authentication is for real clusters, not CI.
export RAY_AUTH_MODE ?= disabled
export RAY_USAGE_STATS_ENABLED ?= 0

.PHONY: browser console-assets model-server model-server-stop otel-backend otel-backend-stop demo test lint typecheck imports unit integration e2e proto bench fuzz load fmt clean help

help:
	@echo "make demo   - start a local Ray, launch the four agents, pursue the built-in goal"
	@echo "make test   - lint, type-check, import contracts, unit + integration + e2e tests"
	@echo "make unit / integration / e2e - the tests of one kind (tests/unit, tests/integration, tests/e2e)"
	@echo "make bench  - benchmarks; JSON in .bench/results.json and a table in BENCHMARKS.md"
	@echo "make proto  - regenerate protocol/_gen/ from proto/"
	@echo "make fuzz   - the long fuzz campaign of the server pipeline (>100,000 calls)"
	@echo "make load   - 64 callers for 60 s per phase against one agent (below/above admission)"
	@echo "make console-assets - the web console's scripts (htmx, Mermaid) from the npm registry"
	@echo "make otel-backend / otel-backend-stop - Phoenix on 127.0.0.1:6006 for traces"
	@echo "make model-server / model-server-stop - llama.cpp serving Gemma 3 270M on 127.0.0.1:8089"
	@echo "make clean  - remove caches and build files (not the venvs, .pg, or any deployment's state)"

# `make demo` installs the runtime alone; `make test` adds the development tools (.[dev]).
$(RUN_STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	@touch $(RUN_STAMP)

$(STAMP): pyproject.toml $(RUN_STAMP) $(CONSOLE_ASSETS)
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	@$(MAKE) --no-print-directory .typecheck/stratagem
	@touch $(STAMP)


$(CONSOLE_ASSETS): package.json package-lock.json runtime/_console/vendor.txt
	bash scripts/console_assets.sh

console-assets:
	bash scripts/console_assets.sh

# The console's browser tests drive Debian's Chromium (a browser downloaded at test time cannot be
# fetched): installed with apt-get when missing and this is root, else they say how.
browser:
	bash scripts/browser.sh

# The layer folders install as stratagem.<layer> (pyproject's package-dir); an editable install
# maps them with an import hook that mypy does not run, so mypy reads them through this link tree.
.typecheck/stratagem:
	@mkdir -p .typecheck/stratagem
	@for layer in agents planning protocol runtime; do ln -sfn ../../$$layer .typecheck/stratagem/$$layer; done

demo: $(RUN_STAMP)
	@test -f $(CONSOLE_ASSETS) || bash scripts/console_assets.sh --optional
	$(BIN)/stratagem demo
	@echo "Next: source $(BIN)/activate, then stratagem --help (README: Quick start)."

# Arize Phoenix in its own venv (under ~/.cache/stratagem: scripts/otel_backend.sh venv), on 127.0.0.1 only: UI/API :6006, OTLP gRPC :4317.
# `make demo` and `stratagem trace` use it while it runs (scripts/otel_backend.sh).
# llama.cpp's OpenAI-compatible server with Gemma 3 270M (Q4_K_M) in its own venv (built from
# source once, kept outside the checkout under ~/.cache/stratagem: scripts/model_server.sh venv), on 127.0.0.1:8089 only (scripts/model_server.sh).
model-server:
	bash scripts/model_server.sh start

model-server-stop:
	bash scripts/model_server.sh stop

otel-backend:
	bash scripts/otel_backend.sh start

otel-backend-stop:
	bash scripts/otel_backend.sh stop

proto: $(STAMP)
	bash scripts/gen_protos.sh

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

imports: $(STAMP)
	$(BIN)/lint-imports

# Tests by kind, by folder (tests/conftest.py adds the unit/integration/e2e marker from it).
unit: $(STAMP)
	$(BIN)/pytest -q tests/unit

integration: $(STAMP)
	$(BIN)/pytest -q tests/integration

e2e: $(STAMP)
	$(BIN)/pytest -q tests/e2e

# The model integration tests run against the embedded model server: built once (about 10 minutes
# on 2 cores, then kept under ~/.cache/stratagem, where a fresh clone on the same machine finds it)
# before the tests, which start and stop it themselves.
MODEL_STAMP := $(shell bash scripts/model_server.sh venv)/.model-server-installed

$(MODEL_STAMP):
	bash scripts/model_server.sh install

# The tests of one file run in one worker (--dist loadfile: a module's deployment, browser or
# server is made once); TEST_WORKERS=0 runs them all in this process, in order.
TEST_WORKERS ?= 3

test: lint typecheck imports browser $(MODEL_STAMP)
	$(BIN)/pytest -q -ra $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

bench: $(STAMP)
	@$(BIN)/python -m tests.bench

# The long fuzz run (the short one is part of `make test`) against one server; failing examples
# are kept in .hypothesis/. Hypothesis counts a repeated input towards its examples without calling
# the server again (100,000 examples made 80,201 calls), so 130,000 makes over 100,000 calls.
fuzz: $(STAMP)
	STRATAGEM_FUZZ_EXAMPLES=130000 $(BIN)/pytest -q -s --timeout=3600 \
		--hypothesis-show-statistics tests/integration/protocol/test_fuzz.py

# 64 callers for 60 s per phase against a served perception agent; JSON in .bench/load.json.
load: $(STAMP)
	$(BIN)/python -m tests.load.load

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# What the tools and tests leave in this folder. Kept: the virtual environments (.venv, .lowest-venv,
# and .otel-venv/.model-venv of older checkouts: minutes to rebuild; the tool venvs now live under
# ~/.cache/stratagem), a PostgreSQL cluster in .pg (scripts/postgres.sh
# stop, then remove it) and a deployment's state: the state directory is the user's
# (~/.local/state/stratagem) unless a .stratagem folder was made here ('stratagem down' stops it).
clean:
	rm -rf .pytest_cache .mypy_cache .ruff_cache .import_linter_cache .hypothesis .bench build dist node_modules
	find runtime/_console/static/vendor -mindepth 1 ! -name README.md -delete
	find . -name __pycache__ -type d -not -path './.*' -prune -exec rm -rf {} +
