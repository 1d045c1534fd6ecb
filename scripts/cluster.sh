#!/usr/bin/env bash
# A throwaway PostgreSQL 15 cluster owned by the postgres OS user (PostgreSQL will not run
# as root), on a private port and socket directory.
#   scripts/cluster.sh start DIR PORT [postgresql.conf lines...]   initdb if needed, start
#   scripts/cluster.sh stop DIR
# Clients connect with: psql -h DIR/socket -p PORT -U postgres
set -euo pipefail
# The server inherits our environment: with RUST_BACKTRACE set, errors that pass through
# Rust would carry a backtrace in their DETAIL.
unset RUST_BACKTRACE RUST_LIB_BACKTRACE

PGBIN=$(pg_config --bindir 2>/dev/null || echo /usr/lib/postgresql/15/bin)
[ -x "$PGBIN/initdb" ] || PGBIN=/usr/lib/postgresql/15/bin

# From /, which the postgres user can enter (the work tree may be a root-only folder).
as_postgres() {
    if [ "$(id -u)" = 0 ]; then (cd / && runuser -u postgres -- "$@"); else "$@"; fi
}

cmd=${1:?start|stop}
dir=$(realpath -m "${2:?cluster directory}")
case "$cmd" in
start)
    port=${3:?port}
    shift 3
    if [ ! -f "$dir/data/PG_VERSION" ]; then
        mkdir -p "$dir"
        [ "$(id -u)" = 0 ] && chown postgres: "$dir"
        as_postgres "$PGBIN/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log"
        as_postgres mkdir -p "$dir/socket"
        {
            echo "port = $port"
            echo "listen_addresses = '127.0.0.1'"
            echo "unix_socket_directories = '$dir/socket'"
            echo "max_connections = 120"
            echo "fsync = off"
            for line in "$@"; do echo "$line"; done
        } | as_postgres tee -a "$dir/data/postgresql.conf" >/dev/null
    fi
    as_postgres "$PGBIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null
    ;;
stop)
    if [ -f "$dir/data/postmaster.pid" ]; then
        as_postgres "$PGBIN/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null || true
    fi
    ;;
*)
    echo "usage: $0 start DIR PORT [conf lines] | stop DIR" >&2
    exit 2
    ;;
esac
