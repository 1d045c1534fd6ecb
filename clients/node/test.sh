#!/usr/bin/env bash
# The Node package's suite: installs what it needs (npm ci from
# package-lock.json), packs the package (scripts/build-artifacts.sh node: npm pack), starts a throwaway PostgreSQL 15 cluster with the
# extension (tests/lib.sh) and Debian's pgbouncer in transaction-pooling mode in front of it, and
# runs `node --test` (client, demo apps over real HTTP, crashes, the database stopped under the demos,
# pgbouncer, types, the packed tarball, the README's install commands and example apps in $dir/readme).
#
# Ports and folder: tests/lib.sh's "node" row (PostgreSQL, pgbouncer = +1) and its folder; the demo
# servers listen from DEMO_PORT_BASE (default: tests/lib.sh's node-demos). NODE_SUITE_PORT / NODE_SUITE_DIR override.
# Last line: "clients-node: N passed, M failed".
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../tests/lib.sh"
pg_port=${NODE_SUITE_PORT:-$(port_of node)}
bouncer_port=$((pg_port + 1))
dir=${NODE_SUITE_DIR:-$(dir_of node)}
export DEMO_PORT_BASE=${DEMO_PORT_BASE:-$(port_of node-demos)}

if [ "$IDEM_EDITION" = native ] && ! extension_installed; then
    echo "== the extension is not installed in PostgreSQL $PG_MAJOR: building and installing it (cargo pgrx install)"
    (cd "$ROOT" && PATH="$HOME/.cargo/bin:$PATH" cargo pgrx install --release --pg-config "$PGBIN/pg_config")
fi

cd "$here"
echo "== npm ci"
npm ci --no-audit --no-fund --loglevel=error
cluster_stop "$dir/pg"
rm -rf "$dir"
mkdir -p "$dir"
echo "== scripts/build-artifacts.sh node (npm pack)"
pack_file=$("$ROOT/scripts/build-artifacts.sh" node "$dir/dist" | tail -1)

# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
    pgbouncer_stop "$dir"
    cluster_stop "$dir/pg"
}
trap cleanup EXIT

echo "== PostgreSQL $PG_MAJOR on port $pg_port, pgbouncer (transaction pooling) on port $bouncer_port"
cluster_start "$dir/pg" "$pg_port" "$LISTEN_TCP"
install_extension postgres -h "$dir/pg/socket" -p "$pg_port" -U postgres
pgbouncer_start "$dir" "$bouncer_port" "$pg_port"

echo "== node --test"
status=0
DATABASE_URL="postgresql://postgres@127.0.0.1:$pg_port/postgres" \
PGBOUNCER_URL="postgresql://postgres@127.0.0.1:$bouncer_port/postgres" \
PACK_FILE="$pack_file" \
PG_DATA_DIR="$dir/pg/data" PG_BIN="$PGBIN" SUITE_DIR="$dir" \
    node --test --test-concurrency=1 \
        --test-reporter=spec --test-reporter-destination=stdout \
        --test-reporter=tap --test-reporter-destination="$dir/results.tap" \
        test/*.test.js || status=$?

touch "$dir/results.tap"
tap_count() { sed -n "s/^# $1 \([0-9]*\)$/\1/p" "$dir/results.tap" | tail -1; }
passed=$(tap_count pass)
fails=$(tap_count fail)
cancelled=$(tap_count cancelled)
failed=$(( ${fails:-0} + ${cancelled:-0} ))
grep -E '# SKIP' "$dir/results.tap" | sed 's/^ */skipped: /' || true
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi
echo "clients-node: ${passed:-0} passed, $failed failed"
exit $(( status != 0 || failed != 0 ))
