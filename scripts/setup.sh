#!/usr/bin/env bash
# Command 1 of the README: on a fresh Debian 12 machine, as root, install what is needed,
# build and install the extension, start a throwaway PostgreSQL cluster and run the demo.
#   scripts/setup.sh              PostgreSQL 15: cluster in /tmp/idempotency-demo
#   scripts/setup.sh --pg 18      PostgreSQL 18: /tmp/idempotency-demo-pg18
# on the port of tests/lib.sh's "demo" row (DEMO_DIR / DEMO_PORT override the folder and port).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --pg ]; then
    major=${2:?--pg needs a major (15 or 18)}
elif [ $# -gt 0 ]; then
    echo "usage: $0 [--pg 15|18]" >&2
    exit 2
fi

scripts/install-deps.sh
PG_MAJOR=${major:-15}
. tests/lib.sh || exit 2
export PATH="$HOME/.cargo/bin:$PATH"
DEMO_DIR=${DEMO_DIR:-$(dir_of demo)}
DEMO_PORT=${DEMO_PORT:-$(port_of demo)}

echo "== building and installing the extension (release) into PostgreSQL $PG_MAJOR"
cargo pgrx install --release --pg-config "$PGBIN/pg_config" --no-default-features --features "pg$PG_MAJOR"

echo "== starting a throwaway cluster in $DEMO_DIR on port $DEMO_PORT"
# On 127.0.0.1 too: the client examples and demo apps one tries against it connect over TCP.
cluster_fresh "$DEMO_DIR" "$DEMO_PORT" "$LISTEN_TCP"

install_extension postgres -h "$DEMO_DIR/socket" -p "$DEMO_PORT" -U postgres
echo "== demo"
psql -X -q -v ON_ERROR_STOP=1 -h "$DEMO_DIR/socket" -p "$DEMO_PORT" -U postgres -f examples/demo.sql

cat <<MSG

The cluster is still running. Connect with:
    $PGBIN/psql -h $DEMO_DIR/socket -p $DEMO_PORT -U postgres
Stop it with:
    scripts/cluster.sh stop $DEMO_DIR
MSG
