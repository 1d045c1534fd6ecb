#!/usr/bin/env bash
# The Node package's suite: installs what it needs (pgbouncer from apt when missing, npm ci from
# package-lock.json), packs the package (npm pack), starts a throwaway PostgreSQL 15 cluster with the
# extension and Debian's pgbouncer in transaction-pooling mode in front of it, and runs `node --test`
# (client, demo apps over real HTTP, crashes, pgbouncer, types, the packed tarball).
# Ports 56410 (PostgreSQL), 56411 (pgbouncer), 56420+ (demo servers); folder /tmp/idem-node-test.
# Last line: "clients-node: N passed, M failed".
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
dir=/tmp/idem-node-test
pg_port=56410
bouncer_port=56411
PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config

if ! command -v pgbouncer >/dev/null && [ ! -x /usr/sbin/pgbouncer ]; then
    echo "== installing pgbouncer (apt)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >/dev/null
fi
PGBOUNCER=$(command -v pgbouncer || echo /usr/sbin/pgbouncer)

if [ ! -f "$("$PG_CONFIG" --sharedir)/extension/idempotency.control" ]; then
    echo "== the extension is not installed in PostgreSQL 15: building and installing it (cargo pgrx install)"
    (cd "$root" && PATH="$HOME/.cargo/bin:$PATH" cargo pgrx install --release --pg-config "$PG_CONFIG")
fi

cd "$here"
echo "== npm ci"
npm ci --no-audit --no-fund --loglevel=error
rm -rf "$dir"
mkdir -p "$dir"
echo "== npm pack"
pack_file=$dir/$(npm pack --silent --pack-destination "$dir" | tail -1)

cleanup() {
    if [ -f "$dir/pgbouncer.pid" ]; then kill "$(cat "$dir/pgbouncer.pid")" 2>/dev/null || true; fi
    "$root/scripts/cluster.sh" stop "$dir/pg"
}
trap cleanup EXIT

echo "== PostgreSQL 15 on port $pg_port, pgbouncer (transaction pooling) on port $bouncer_port"
"$root/scripts/cluster.sh" start "$dir/pg" "$pg_port"
psql -X -q -v ON_ERROR_STOP=1 -h "$dir/pg/socket" -p "$pg_port" -U postgres -c 'CREATE EXTENSION idempotency'
cat >"$dir/pgbouncer.ini" <<INI
[databases]
postgres = host=127.0.0.1 port=$pg_port dbname=postgres
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $bouncer_port
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
pool_mode = transaction
default_pool_size = 30
max_client_conn = 300
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
INI
echo '"postgres" ""' >"$dir/userlist.txt"
chown -R postgres: "$dir/pgbouncer.ini" "$dir/userlist.txt"
chmod 777 "$dir"
(cd / && runuser -u postgres -- "$PGBOUNCER" -d "$dir/pgbouncer.ini")
for _ in $(seq 50); do
    psql -X -q -h 127.0.0.1 -p "$bouncer_port" -U postgres -c 'SELECT 1' postgres >/dev/null 2>&1 && break
    sleep 0.1
done

echo "== node --test"
status=0
DATABASE_URL="postgresql://postgres@127.0.0.1:$pg_port/postgres" \
PGBOUNCER_URL="postgresql://postgres@127.0.0.1:$bouncer_port/postgres" \
PACK_FILE="$pack_file" \
    node --test --test-concurrency=1 \
        --test-reporter=spec --test-reporter-destination=stdout \
        --test-reporter=tap --test-reporter-destination="$dir/results.tap" \
        test/*.test.js || status=$?

tap_count() { sed -n "s/^# $1 \([0-9]*\)$/\1/p" "$dir/results.tap" | tail -1; }
touch "$dir/results.tap"
passed=$(tap_count pass)
fails=$(tap_count fail)
cancelled=$(tap_count cancelled)
failed=$(( ${fails:-0} + ${cancelled:-0} ))
grep -E '# SKIP' "$dir/results.tap" | sed 's/^ */skipped: /' || true
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi
echo "clients-node: ${passed:-0} passed, $failed failed"
exit $(( status != 0 || failed != 0 ))
