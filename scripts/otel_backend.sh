#!/usr/bin/env bash
# A development OpenTelemetry backend: Arize Phoenix (an OTLP receiver with a query API and a UI),
# installed into its own virtual environment, apart from the project's, and run on loopback only.
#
#   scripts/otel_backend.sh install   create the venv and install arize-phoenix (idempotent)
#   scripts/otel_backend.sh start     install if needed, start Phoenix in the background, wait for it
#   scripts/otel_backend.sh stop      stop the Phoenix this script started (by its recorded PID)
#   scripts/otel_backend.sh status    exit 0 and print the state file when it runs, else exit 1
#   scripts/otel_backend.sh url       print the UI/API URL of the running Phoenix
#   scripts/otel_backend.sh venv      print the virtual environment's folder
#
# Environment (all optional):
#   OTEL_BACKEND_VENV   the virtual environment                 (default: a folder per spec and Python
#                       under ~/.cache/stratagem, STRATAGEM_TOOLS_CACHE or XDG_CACHE_HOME, outside the
#                       checkout, so a fresh clone reuses it)
#   OTEL_BACKEND_DIR    PID, state file, log and Phoenix's data (default $STRATAGEM_STATE_DIR/otel-backend,
#                       STRATAGEM_STATE_DIR defaulting as the CLI's does: the nearest .stratagem folder
#                       here or above, else ${XDG_STATE_HOME:-~/.local/state}/stratagem)
#   PHOENIX_PORT        HTTP port: UI, REST API and OTLP/HTTP   (default 6006)
#   PHOENIX_GRPC_PORT   OTLP/gRPC port                          (default 4317)
#   PHOENIX_SPEC        what pip installs                       (default arize-phoenix)
#   PYTHON              the interpreter that makes the venv     (default python3)
#
# The state file ($OTEL_BACKEND_DIR/backend.json) tells the Stratagem CLI where to export spans and
# traces and where `stratagem trace` reads them from. Phoenix listens on 127.0.0.1 only (its gRPC
# receiver through scripts/phoenix_loopback.py, since Phoenix itself binds that one everywhere).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/_service.sh
source "$HERE/_service.sh"
DIR="${OTEL_BACKEND_DIR:-${STRATAGEM_STATE_DIR:-$(default_state_dir)}/otel-backend}"
HOST=127.0.0.1
PORT="${PHOENIX_PORT:-6006}"
GRPC_PORT="${PHOENIX_GRPC_PORT:-4317}"
SPEC="${PHOENIX_SPEC:-arize-phoenix}"
PYTHON="${PYTHON:-python3}"
VENV="${OTEL_BACKEND_VENV:-$(tools_cache_dir)/otel-backend-$(spec_key "$SPEC")}"
PID_FILE="$DIR/phoenix.pid"
STATE_FILE="$DIR/backend.json"
LOG_FILE="$DIR/phoenix.log"
STAMP="$VENV/.phoenix-installed"

log() { echo "otel-backend: $*" >&2; }

answers() {
    # Whether Phoenix's HTTP API answers on the given port.
    "$VENV/bin/python" - "$1" <<'PY' 2>/dev/null
import sys, urllib.request
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/healthz", timeout=2) as reply:
        sys.exit(0 if reply.status == 200 else 1)
except Exception:
    sys.exit(1)
PY
}

install() {
    if [[ -f "$STAMP" && -x "$VENV/bin/phoenix" ]]; then
        return 0
    fi
    log "installing $SPEC into $VENV (once; this takes a few minutes)"
    [[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet "$SPEC"
    touch "$STAMP"
}

start() {
    if pid="$(running_pid)"; then
        log "already running (pid $pid): http://$HOST:$(state_port)"
        return 0
    fi
    install
    mkdir -p "$DIR/data"
    local dir_abs
    dir_abs="$(cd "$DIR" && pwd)"
    # setsid: its own session, so stopping it by PID takes no other process along, and a shell
    # that exits does not hang it up.
    PHOENIX_HOST="$HOST" PHOENIX_PORT="$PORT" PHOENIX_GRPC_PORT="$GRPC_PORT" \
    PHOENIX_WORKING_DIR="$dir_abs/data" PHOENIX_TELEMETRY_ENABLED=false \
        setsid "$VENV/bin/python" "$HERE/phoenix_loopback.py" serve >"$LOG_FILE" 2>&1 </dev/null &
    local pid=$!
    echo "$pid" >"$PID_FILE"
    for _ in $(seq 1 240); do
        if ! kill -0 "$pid" 2>/dev/null; then
            log "Phoenix exited while starting; last lines of $LOG_FILE:"
            tail -n 20 "$LOG_FILE" >&2
            rm -f "$PID_FILE"
            return 1
        fi
        if answers "$PORT"; then
            cat >"$STATE_FILE" <<JSON
{"kind": "phoenix", "pid": $pid, "url": "http://$HOST:$PORT", "otlp_endpoint": "http://$HOST:$GRPC_PORT", "otlp_protocol": "grpc", "project": "default"}
JSON
            log "Phoenix running (pid $pid): UI and API http://$HOST:$PORT, OTLP gRPC $HOST:$GRPC_PORT"
            return 0
        fi
        sleep 0.5
    done
    log "Phoenix did not answer on port $PORT within 120 s; see $LOG_FILE"
    kill "$pid" 2>/dev/null || true
    rm -f "$PID_FILE"
    return 1
}

state_port() {
    sed -n 's/.*"url": "http:\/\/[^:]*:\([0-9]*\)".*/\1/p' "$STATE_FILE" 2>/dev/null || echo "$PORT"
}

status() {
    if running_pid >/dev/null && [[ -f "$STATE_FILE" ]]; then
        cat "$STATE_FILE"
        return 0
    fi
    log "not running"
    return 1
}

url() {
    running_pid >/dev/null && [[ -f "$STATE_FILE" ]] || { log "not running"; return 1; }
    echo "http://$HOST:$(state_port)"
}

case "${1:-}" in
    install) install ;;
    start) start ;;
    stop) stop ;;
    status) status ;;
    url) url ;;
    venv) echo "$VENV" ;;
    *)
        echo "usage: $0 install|start|stop|status|url|venv" >&2
        exit 2
        ;;
esac
