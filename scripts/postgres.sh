#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for the tests of the PostgreSQL stores.
#
#   bash scripts/postgres.sh start   initdb (first time), start, print the URL
#   bash scripts/postgres.sh stop    stop the cluster this script started (data is kept)
#   bash scripts/postgres.sh url     print the URL
#
# The cluster lives in .pg/ (STRATAGEM_PG_DIR), listens only on 127.0.0.1:54329 (STRATAGEM_PG_PORT),
# and trusts the database user "stratagem" (no password: it is reachable from this machine only).
# PostgreSQL refuses to run as root, so under root the server runs as an unprivileged OS user:
# "postgres" when it exists, otherwise "stratagem-pg", created here. The binaries are taken from
# PATH, then from /usr/lib/postgresql/*/bin; when neither has them, the distribution's package is
# installed with apt-get.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PGDIR="${STRATAGEM_PG_DIR:-$ROOT/.pg}"
PORT="${STRATAGEM_PG_PORT:-54329}"
DBUSER="stratagem"
DATA="$PGDIR/data"
LOG="$PGDIR/postgres.log"
URL="postgresql://$DBUSER@127.0.0.1:$PORT/postgres"

die() {
    echo "postgres.sh: $*" >&2
    exit 1
}

find_bindir() {
    local candidate
    if candidate="$(command -v pg_ctl 2>/dev/null)" && [[ -x "$(dirname "$candidate")/initdb" ]]; then
        dirname "$(readlink -f "$candidate")"
        return 0
    fi
    # The newest installed major version first.
    for candidate in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k4 -n -r); do
        if [[ -x "$candidate/pg_ctl" && -x "$candidate/initdb" ]]; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

ensure_binaries() {
    if BINDIR="$(find_bindir)"; then
        return 0
    fi
    command -v apt-get >/dev/null || die "no PostgreSQL binaries and no apt-get to install them"
    [[ "$(id -u)" == 0 ]] || die "no PostgreSQL binaries; run as root to install them with apt-get"
    echo "postgres.sh: installing PostgreSQL with apt-get" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
    BINDIR="$(find_bindir)" || die "apt-get installed postgresql but pg_ctl was not found"
}

# Run a command as the cluster's OS user (root cannot run PostgreSQL).
as_owner() {
    if [[ "$(id -u)" != 0 ]]; then
        "$@"
    elif command -v runuser >/dev/null; then
        runuser -u "$OWNER" -- "$@"
    else
        su -s /bin/sh "$OWNER" -c "$(printf '%q ' "$@")"
    fi
}

choose_owner() {
    if [[ "$(id -u)" != 0 ]]; then
        OWNER="$(id -un)"
    elif id postgres >/dev/null 2>&1; then
        OWNER="postgres"
    else
        OWNER="stratagem-pg"
        id "$OWNER" >/dev/null 2>&1 ||
            useradd --system --no-create-home --shell /usr/sbin/nologin "$OWNER"
    fi
}

running() {
    [[ -n "${BINDIR:-}" && -f "$DATA/PG_VERSION" ]] && as_owner "$BINDIR/pg_ctl" status -D "$DATA" >/dev/null 2>&1
}

start() {
    ensure_binaries
    choose_owner
    mkdir -p "$PGDIR"
    # Keep the cluster out of git without touching the repository's .gitignore.
    [[ -e "$PGDIR/.gitignore" ]] || echo "*" >"$PGDIR/.gitignore"
    if [[ "$(id -u)" == 0 ]]; then
        chown "$OWNER" "$PGDIR"
        # The server must reach its directory through every parent folder.
        chmod o+x "$PGDIR"
    fi
    if [[ ! -f "$DATA/PG_VERSION" ]]; then
        as_owner "$BINDIR/initdb" -D "$DATA" -U "$DBUSER" --auth=trust --encoding=UTF8 \
            --locale=C.UTF-8 --no-instructions >/dev/null 2>&1 ||
            as_owner "$BINDIR/initdb" -D "$DATA" -U "$DBUSER" --auth=trust --encoding=UTF8 \
                --locale=C >/dev/null
    fi
    if running; then
        echo "$URL"
        return 0
    fi
    # TCP on 127.0.0.1 only; the Unix socket goes into the cluster's own folder.
    as_owner "$BINDIR/pg_ctl" start -D "$DATA" -l "$LOG" -w -t 60 \
        -o "-p $PORT -c listen_addresses=127.0.0.1 -k $PGDIR -c max_connections=200" \
        >/dev/null || {
        tail -n 20 "$LOG" >&2 || true
        die "PostgreSQL did not start (log: $LOG)"
    }
    echo "$URL"
}

stop() {
    BINDIR="$(find_bindir)" || return 0
    [[ -f "$DATA/PG_VERSION" ]] || return 0
    choose_owner
    if running; then
        as_owner "$BINDIR/pg_ctl" stop -D "$DATA" -m fast -w >/dev/null
    fi
}

case "${1:-}" in
start) start ;;
stop) stop ;;
url) echo "$URL" ;;
*)
    echo "usage: $0 start|stop|url" >&2
    exit 2
    ;;
esac
