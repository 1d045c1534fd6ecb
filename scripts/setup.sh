#!/usr/bin/env bash
# Command 1 of the README: on a fresh Debian 12 machine, as root, install what is needed,
# build and install the extension, start a throwaway PostgreSQL cluster and run the demo.
#   scripts/setup.sh            (cluster in /tmp/idempotency-demo, port 54329)
set -euo pipefail
cd "$(dirname "$0")/.."

DEMO_DIR=${DEMO_DIR:-/tmp/idempotency-demo}
DEMO_PORT=${DEMO_PORT:-54329}

scripts/install-deps.sh
export PATH="$HOME/.cargo/bin:$PATH"

echo "== building and installing the extension (release)"
cargo pgrx install --release --pg-config /usr/lib/postgresql/15/bin/pg_config

echo "== starting a throwaway cluster in $DEMO_DIR on port $DEMO_PORT"
scripts/cluster.sh stop "$DEMO_DIR"
rm -rf "$DEMO_DIR"
scripts/cluster.sh start "$DEMO_DIR" "$DEMO_PORT"

psql() { command psql -X -q -v ON_ERROR_STOP=1 -h "$DEMO_DIR/socket" -p "$DEMO_PORT" -U postgres "$@"; }
psql -c "CREATE EXTENSION idempotency"
echo "== demo"
psql -f examples/demo.sql

cat <<MSG

The cluster is still running. Connect with:
    psql -h $DEMO_DIR/socket -p $DEMO_PORT -U postgres
Stop it with:
    scripts/cluster.sh stop $DEMO_DIR
MSG
