#!/usr/bin/env bash
# The dependency floors in pyproject.toml are true: installs the LOWEST versions they allow (uv's
# lowest-direct resolution: each direct dependency at its floor, the rest as the floors need) into
# a venv of its own, .lowest-venv/, and runs the unit tests there. Test tools come at their usual
# versions (they are not Stratagem's dependencies). Usage: scripts/lowest.sh [pytest args...]
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
venv=.lowest-venv
py="${PYTHON:-python3}"
if [ ! -x "$venv/bin/uv" ]; then
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet uv
fi
export VIRTUAL_ENV="$repo/$venv"
# Runtime dependencies at their floors, the optional ones the unit tests use included (pypdf
# reads research sources); editable, so the tests import this tree.
"$venv/bin/uv" pip install --quiet --resolution lowest-direct -e ".[postgres,model,pdf]"
# What the unit tests need besides, at current versions, without moving the floors (not
# grpcio-tools, which needs the newest grpcio, nor import-linter, which needs a newer rich: the
# freshness of protocol/_gen/ and the import contracts are make test's checks). Not at the floors
# either: the console test that holds twenty live streams open through Starlette's TestClient (at
# Starlette 0.41 the client's portal never ends an open stream, and the run hangs);
# tests/integration/runtime/test_console_live.py holds them under uvicorn at every version.
"$venv/bin/uv" pip install --quiet "pytest>=8" "pytest-asyncio>=0.24" "pytest-timeout>=2.3" \
  "pytest-xdist>=3.5" "hypothesis>=6.100" "psycopg[binary]"
"$venv/bin/python" - <<'PY'
import importlib.metadata as m
names = ["ray", "grpcio", "protobuf", "pydantic", "pydantic-settings", "opentelemetry-sdk",
         "typer", "rich", "pyyaml", "cryptography", "jmespath", "psycopg", "psycopg-pool",
         "openai", "mcp", "a2a-sdk", "starlette", "jinja2"]
print("lowest:", ", ".join(f"{n} {m.version(n)}" for n in names))
PY
RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 "$venv/bin/python" -m pytest -q -p no:cacheprovider -n "${TEST_WORKERS:-3}" \
  tests/unit -m "not postgres" \
  --deselect tests/unit/test_architecture.py::test_generated_protobuf_code_is_fresh \
  --deselect tests/unit/test_architecture.py::test_import_contracts_hold \
  --ignore tests/unit/test_import_contracts.py \
  --deselect tests/unit/test_architecture.py::test_the_examples_generated_code_is_not_stale \
  --deselect tests/unit/runtime/test_console.py::test_a_session_cannot_take_every_watch_slot_with_live_streams \
  "$@"
