#!/usr/bin/env bash
# The official A2A TCK (a2aproject/a2a-tck, its A2A 1.0 suite) against one Stratagem agent.
#
#   scripts/a2a_tck.sh install          make .tck-venv with what the TCK imports (from PyPI)
#   scripts/a2a_tck.sh run [LEVEL ...]  serve the TCK's scenario agent over A2A (tests/integration/
#                                       a2a_tck_sut.py) and run the TCK's JSON-RPC requirements of
#                                       each LEVEL (must, should, may; default: must); exit 1 when
#                                       any fails
#
# The TCK is not published on PyPI: A2A_TCK_DIR must name a checkout of it (its 1.0 suite; the
# project neither fetches nor builds it). Its reports land in $A2A_TCK_DIR/reports/.
#
# Environment:
#   A2A_TCK_DIR   the TCK checkout (required for run)
#   TCK_VENV      the TCK's own virtual environment        (default .tck-venv; relative to the
#                                                          repository, or absolute)
#   TCK_PORT      the agent's A2A port                     (default a free one)
#   PYTHON        the interpreter that makes the venv      (default python3)
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
venv="${TCK_VENV:-.tck-venv}"
case "$venv" in /*) ;; *) venv="$repo/$venv" ;; esac
# The agent's process and its log: globals, since the EXIT trap runs after run() has returned.
sut_pid=""
sut_log=""

cleanup() {
  if [ -n "$sut_pid" ]; then
    kill "$sut_pid" 2>/dev/null || true
    wait "$sut_pid" 2>/dev/null || true
  fi
  if [ -n "$sut_log" ]; then rm -f "$sut_log"; fi
}
# What the TCK's suite imports (its pyproject's dependencies), at versions it was run with here.
requirements=(
  "pytest>=8.0" "pytest-asyncio>=0.23" "httpx>=0.27" "grpcio>=1.60" "protobuf>=4.25"
  "googleapis-common-protos>=1.62" "jsonschema>=4.21" "pytest-html>=4.1"
  "gherkin-official>=29.0" "Jinja2>=3.1"
)

install() {
  local stamp="$venv/.requirements"
  if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "${requirements[*]}" ]; then
    return
  fi
  "${PYTHON:-python3}" -m venv --clear "$venv"
  "$venv/bin/python" -m pip install --quiet "${requirements[@]}"
  echo "${requirements[*]}" > "$stamp"
}

run() {
  local levels=("${@:-must}")
  : "${A2A_TCK_DIR:?A2A_TCK_DIR must name a checkout of a2aproject/a2a-tck}"
  [ -f "$A2A_TCK_DIR/run_tck.py" ] || { echo "no run_tck.py in $A2A_TCK_DIR" >&2; exit 2; }
  install
  local port="${TCK_PORT:-$("$repo/.venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
  sut_log="$(mktemp)"
  trap cleanup EXIT
  "$repo/.venv/bin/python" -m tests.integration.a2a_tck_sut "$port" >"$sut_log" 2>&1 &
  sut_pid=$!
  for _ in $(seq 100); do
    grep -q '^ready ' "$sut_log" && break
    kill -0 "$sut_pid" 2>/dev/null || { cat "$sut_log" >&2; exit 1; }
    sleep 0.2
  done
  grep -q '^ready ' "$sut_log" || { echo "the agent did not serve within 20 s" >&2; exit 1; }
  local status=0
  for level in "${levels[@]}"; do
    echo "== A2A TCK, level $level, JSON-RPC, against $(grep '^ready ' "$sut_log" | cut -d' ' -f2)"
    (cd "$A2A_TCK_DIR" && "$venv/bin/python" run_tck.py \
      --sut-host "http://127.0.0.1:$port" --transport jsonrpc --level "$level") || status=1
  done
  return "$status"
}

case "${1:-}" in
  install) install ;;
  run) shift; run "$@" ;;
  *) echo "usage: $0 install | run [must|should|may ...]" >&2; exit 2 ;;
esac
