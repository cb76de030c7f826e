# Shared by the scripts that run a development service in the background (otel_backend.sh,
# model_server.sh): where the CLI's state directory is, and a service's PID file. Source it after
# setting PID_FILE, STATE_FILE and a log() function.

# The CLI's default state directory (runtime/config/_settings.py default_state_dir): the nearest .stratagem
# folder here or above, else ${XDG_STATE_HOME:-~/.local/state}/stratagem.
default_state_dir() {
    local dir
    dir="$(pwd -P)"
    while :; do
        if [ -d "$dir/.stratagem" ]; then echo "$dir/.stratagem"; return; fi
        [ "$dir" = / ] && break
        dir="$(dirname "$dir")"
    done
    echo "${XDG_STATE_HOME:-$HOME/.local/state}/stratagem"
}

# Where the development services' own virtual environments are built and kept (the model server
# takes about ten minutes to build): outside the checkout, so a fresh clone on the same machine (CI
# runs on one) reuses them. One folder per pinned spec: a new pin builds anew beside the old one.
tools_cache_dir() {
    echo "${STRATAGEM_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/stratagem}"
}

# A short name for what a tool venv holds: the pinned specs and the interpreter that makes it.
spec_key() {
    local version
    version="$("${PYTHON:-python3}" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    printf '%s\n' "$@" "$version" | sha256sum | cut -c1-12
}

# The recorded PID, if that process is still alive.
running_pid() {
    [[ -f "$PID_FILE" ]] || return 1
    local pid
    pid="$(cat "$PID_FILE")"
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 1
    echo "$pid"
}

# Stop the recorded process (SIGTERM, then SIGKILL after 10 s) and forget it.
stop() {
    local pid
    if ! pid="$(running_pid)"; then
        log "not running"
        rm -f "$PID_FILE" "$STATE_FILE"
        return 0
    fi
    kill -TERM "$pid"
    for _ in $(seq 1 40); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.25
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "pid $pid did not stop on SIGTERM; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$PID_FILE" "$STATE_FILE"
    log "stopped (pid $pid)"
}
