#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for the tests, on 127.0.0.1 and a free port.
#
#   eval "$(scripts/postgres.sh start)"   # exports RESPD_TEST_POSTGRES_DSN and _DIR
#   scripts/postgres.sh stop "$RESPD_TEST_POSTGRES_DIR"
#
# Installs the Debian package when no server binaries are found. initdb refuses to run as
# root, so as root the cluster belongs to the `postgres` user the package creates.
set -euo pipefail

find_bindir() {
    local dir
    for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        [ -x "$dir/initdb" ] && { echo "$dir"; return 0; }
    done
    command -v initdb >/dev/null 2>&1 && { dirname "$(command -v initdb)"; return 0; }
    return 1
}

as_owner() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

start() {
    local bindir
    if ! bindir=$(find_bindir); then
        echo "postgres.sh: installing PostgreSQL from Debian packages" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >&2
        apt-get install -y -qq postgresql >&2
        bindir=$(find_bindir)
    fi
    local dir
    dir=$(mktemp -d /tmp/respd-pg.XXXXXX)
    mkdir "$dir/data" "$dir/run"
    [ "$(id -u)" = 0 ] && chown -R postgres: "$dir"
    # Local trust auth: the cluster listens on loopback only and lives as long as the run.
    as_owner "$bindir/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; exit 1; }
    local port
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    # fsync off: a test cluster trades crash safety of the cluster itself for speed; the
    # durability tests kill respd, never PostgreSQL.
    as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $dir/run -c fsync=off -c max_connections=200" \
        start >&2 || { cat "$dir/server.log" >&2; exit 1; }
    as_owner "$bindir/createdb" -h 127.0.0.1 -p "$port" -U postgres respd_test
    echo "export RESPD_TEST_POSTGRES_DSN=postgresql://postgres@127.0.0.1:$port/respd_test"
    echo "export RESPD_TEST_POSTGRES_DIR=$dir"
}

stop() {
    local dir=${1:?usage: postgres.sh stop DIR}
    local bindir
    bindir=$(find_bindir)
    as_owner "$bindir/pg_ctl" -D "$dir/data" -m immediate -w stop >&2 || true
    rm -rf "$dir"
}

case "${1:-}" in
    start) start ;;
    stop) stop "${2:-}" ;;
    *) echo "usage: $0 start | stop DIR" >&2; exit 2 ;;
esac
