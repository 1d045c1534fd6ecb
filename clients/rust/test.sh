#!/usr/bin/env bash
# The pg-idempotency crate's own suite, one command:
#   1. `cargo package` (the crate packs and builds on its own) and `cargo test --no-run`;
#   2. a throwaway PostgreSQL 15 cluster with the extension (tests/lib.sh), and a second one on its
#      unix socket only (its folder's outage/), which tests stop and start under running apps
#      and senders (tests/outage.rs, tests/sender_faults.rs);
#   3. `cargo test`: unit tests, README.md against the files it shows (tests/readme.rs), the typed
#      client against the real extension (tests/client.rs), the demo app and the README's app
#      (examples/demo.rs, examples/orders.rs) as real processes over real HTTP (tests/http.rs,
#      tests/outage.rs), and the sender (feature reqwest) against real receivers and a database
#      that fails under it (tests/sender.rs, tests/sender_faults.rs);
#   4. the client and HTTP tests again through Debian's pgbouncer in transaction-pooling mode;
#   5. README.md's install commands in a fresh cargo project with its example app
#      (examples/orders.rs copied in as src/main.rs), built and sent one real request twice
#      (201, then the replay; one row).
# Tests that need what the installed extension lacks say so (SKIP) and are not counted as passed.
# Environment: RUST_SUITE_PORT (PostgreSQL; pgbouncer on +1), RUST_SUITE_DIR, TEST_PORT_BASE
# (the demo apps' ports: 8 from there, default: tests/lib.sh's rust-apps), CARGO_TARGET_DIR (default target/clients, shared
# with examples/charges-api). Last line: "rust: N passed, M failed".
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../tests/lib.sh" || exit 2
export PATH="$HOME/.cargo/bin:$PATH"

PORT=${RUST_SUITE_PORT:-$(port_of rust)}
DIR=${RUST_SUITE_DIR:-$(dir_of rust)}
BOUNCER_PORT=$((PORT + 1))
export TEST_PORT_BASE=${TEST_PORT_BASE:-$(port_of rust-apps)}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target/clients}
MANIFEST="$here/Cargo.toml"
SKIP_FILE="$DIR/skips.txt"
failures=0
note_failure() { failures=$((failures + 1)); echo "FAIL $1"; }

echo "== cargo package"
cargo package --locked --quiet --allow-dirty --manifest-path "$MANIFEST" || note_failure "cargo package"
echo "== cargo test --no-run"
cargo test --locked --quiet --no-run --manifest-path "$MANIFEST" --features reqwest || note_failure "cargo test --no-run"

cleanup() {
    pgbouncer_stop "$DIR"
    cluster_stop "$DIR/outage"
    cluster_stop "$DIR"
}
trap cleanup EXIT
cluster_stop "$DIR/outage" # one a run that was killed left behind
cluster_fresh "$DIR" "$PORT" "$LISTEN_TCP" || { echo "rust: 0 passed, 1 failed"; exit 1; }
# The second cluster, on its unix socket only (so the same port number takes no TCP port).
cluster_start "$DIR/outage" "$PORT" "listen_addresses = ''" || { echo "rust: 0 passed, 1 failed"; exit 1; }
export IDEM_RUST_OUTAGE_DIR="$DIR/outage" IDEM_RUST_PGBIN="$PGBIN"
export IDEM_RUST_OUTAGE_URL="postgresql://postgres@/postgres?host=$DIR/outage/socket&port=$PORT"
export RUST_SUITE_LOG_DIR="$DIR/logs"
psql -X -q -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -c "CREATE EXTENSION idempotency" ||
    { echo "rust: 0 passed, 1 failed"; exit 1; }
rm -f "$SKIP_FILE"
as_postgres touch "$SKIP_FILE" 2>/dev/null || touch "$SKIP_FILE"
chmod 666 "$SKIP_FILE"
export SKIP_FILE

passed=0
failed=0
# Runs cargo test with the given arguments, adds its "test result" lines to the counts.
run_tests() {
    local name=$1 log="$DIR/$1.log" status p f line
    shift
    echo "== $name"
    cargo test --locked --no-fail-fast --manifest-path "$MANIFEST" "$@" 2>&1 | tee "$log"
    status=${PIPESTATUS[0]}
    p=0 f=0
    while read -r line; do
        if [[ $line =~ test\ result:\ [a-zA-Z]+\.\ ([0-9]+)\ passed\;\ ([0-9]+)\ failed ]]; then
            p=$((p + BASH_REMATCH[1])); f=$((f + BASH_REMATCH[2]))
        fi
    done <"$log"
    [ "$status" -ne 0 ] && [ "$f" -eq 0 ] && f=1
    passed=$((passed + p)); failed=$((failed + f))
}

# PgBouncer in transaction-pooling mode from the start: tests/sender_faults.rs sends through it
# (IDEM_RUST_PGBOUNCER_URL), and the second run below goes through it.
bouncer=no
pgbouncer_start "$DIR" "$BOUNCER_PORT" "$PORT" && bouncer=yes
[ "$bouncer" = yes ] && export IDEM_RUST_PGBOUNCER_URL="postgresql://postgres@127.0.0.1:$BOUNCER_PORT/postgres"
admin() { psql -X -At -F ' ' -h 127.0.0.1 -p "$BOUNCER_PORT" -U postgres -d pgbouncer -c "$1"; }
carried() { admin "SHOW STATS" | awk '$1 == "postgres" { print $2 }'; }

export DATABASE_URL="postgresql://postgres@127.0.0.1:$PORT/postgres"
run_tests direct --features reqwest -- --test-threads 4

echo "== pgbouncer (pool_mode = transaction) on port $BOUNCER_PORT"
if [ "$bouncer" = yes ]; then
    before=$(carried)
    DATABASE_URL="postgresql://postgres@127.0.0.1:$BOUNCER_PORT/postgres" \
        run_tests pgbouncer --test client --test http --test layer --test round_trips -- --test-threads 4
    # Proof that the run went through pgbouncer in transaction mode (its admin console).
    mode=$(admin "SHOW CONFIG" | awk '$1 == "pool_mode" { print $2 }')
    xacts=$(($(carried) - ${before:-0}))
    echo "pgbouncer: pool_mode=$mode, transactions carried for database postgres in that run: $xacts"
    if [ "$mode" = transaction ] && [ "$xacts" -gt 100 ]; then
        passed=$((passed + 1))
    else
        note_failure "the pgbouncer run did not go through pgbouncer in transaction mode"
    fi
else
    note_failure "pgbouncer did not start (see $DIR/pgbouncer.log)"
fi

# The README as a new user reads it: its `cargo add` lines (the clone's path for
# ../idempotency) in a fresh cargo project, its example app (examples/orders.rs, which
# tests/readme.rs checks the README shows as it is) copied in as src/main.rs, then one real
# request twice. The suite's Cargo.lock is copied in first so that the same versions are chosen
# and the shared CARGO_TARGET_DIR has most of them built already.
readme_app() {
    local proj="$DIR/readme-app" port=$((TEST_PORT_BASE + 7)) pid status=1 line first again
    rm -rf "$proj"
    cargo new --quiet --name readme-app "$proj" || return 1
    cp "$here/Cargo.lock" "$proj/Cargo.lock"
    while read -r line; do
        echo "+ $line"
        (cd "$proj" && eval "${line//..\/idempotency/$ROOT}") || return 1
    done < <(awk '/^```sh/ { block++; next } /^```/ { if (block == 1) exit } block == 1 && /^cargo add / { print }' \
        "$here/README.md")
    cp "$here/examples/orders.rs" "$proj/src/main.rs"
    (cd "$proj" && cargo build --quiet) || return 1
    DATABASE_URL="postgresql://postgres@127.0.0.1:$PORT/postgres" LISTEN="127.0.0.1:$port" \
        "$CARGO_TARGET_DIR/debug/readme-app" >"$DIR/readme-app.log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do (echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
    # One POST as the README's curl line sends it; prints "STATUS REPLAYED-HEADER BODY".
    post() {
        /usr/bin/python3 -c '
import http.client, sys
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=10)
c.request("POST", "/orders", body=b"{\"item\": \"tea\", \"quantity\": 1}",
          headers={"X-Api-Key": "acct_42", "Idempotency-Key": "\"order-1001\"", "Content-Type": "application/json"})
r = c.getresponse()
print(r.status, r.getheader("Idempotent-Replayed", "-"), r.read().decode())' "$port"
    }
    first=$(post)
    again=$(post)
    kill "$pid"
    wait "$pid" 2>/dev/null
    echo "first: $first"
    echo "again: $again"
    if [[ $first == "201 - "* && $again == "201 true "* && ${first#201 - } == "${again#201 true }" ]] &&
        [ "$(psql -X -At -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -c 'SELECT count(*) FROM orders')" = 1 ]; then
        status=0
    fi
    return $status
}
echo "== the README: install and its example app, in a fresh cargo project"
if readme_app; then
    passed=$((passed + 1))
    echo "ok   the README's cargo add lines and example app: 201, then the same body replayed, one order row"
else
    note_failure "the README's install and example app (see above and $DIR/readme-app.log)"
fi

skips=$(wc -l 2>/dev/null <"$SKIP_FILE" || echo 0)
if [ "$skips" -gt 0 ]; then
    echo "skipped (not counted as passed):"
    sed 's/^/  /' "$SKIP_FILE"
fi
passed=$((passed - skips))
failed=$((failed + failures))
echo "rust: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
