#!/usr/bin/env bash
# The Go package's own suite, one command:
#   1. gofmt, go vet, staticcheck (pinned, fetched from the module proxy by `go run`), go build of the
#      module, its demo app (cmd/demo) and the README's example app (examples/orders);
#   2. a throwaway PostgreSQL 15 cluster with the extension (tests/lib.sh), pgbouncer in
#      transaction-pooling mode in front of it; a second cluster, on its unix socket only, that
#      examples/orders/outage_test.go restarts, stops and starts again under the example app;
#      a third (the same way) that sender_faults_test.go stops and starts under the sender's
#      worker (go test runs the two packages at once: a cluster each);
#   3. `go test -race`: the pure parts (key header, stored bodies, the problems against
#      contract/contract.json), the client against the real extension, the middleware over
#      real HTTP on the standard mux and on chi, sessions the server ends under the middleware,
#      the demo app as a real process (SIGKILLed mid-handler and restarted), the example app as
#      a real process with its database restarted, stopped under load and started again;
#   4. the database tests again through pgbouncer, with proof that they went through it;
#   5. examples/clients/go (the SQL contract from plain pgx) against the cluster.
# Skipped tests are listed and not counted as passed.
# Environment: GO_SUITE_PORT (PostgreSQL, and the second cluster's socket; pgbouncer on +1),
# GO_SUITE_DIR, GO_APPS_PORT (the demo app's port, the example app's +1; default tests/lib.sh's
# go-apps). Last line: "go-client: N passed, M failed".
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../../tests/lib.sh
. "$here/../../tests/lib.sh" || exit 2

# Go's own install (the official tarball's place) when go is not on PATH already.
export PATH="$PATH:/usr/local/go/bin"
STATICCHECK=honnef.co/go/tools/cmd/staticcheck@v0.8.2
PORT=${GO_SUITE_PORT:-$(port_of go)}
DIR=${GO_SUITE_DIR:-$(dir_of go)}
BOUNCER_PORT=$((PORT + 1))
APPS_PORT=${GO_APPS_PORT:-$(port_of go-apps)}
export DEMO_LISTEN=127.0.0.1:$APPS_PORT ORDERS_LISTEN=127.0.0.1:$((APPS_PORT + 1))
passed=0
failed=0
skipped=0

if ! command -v go >/dev/null; then
    echo "skip go-client: no Go toolchain here (go is not on PATH)"
    echo "go-client: 0 passed, 0 failed"
    exit 0
fi
cd "$here" || exit 2

step() { # step NAME COMMAND...: one check, passed when the command succeeds
    local name=$1
    shift
    echo "== $name"
    if "$@"; then ok "$name"; else fail "$name"; fi
}

cluster_stop "$DIR/pg"
cluster_stop "$DIR/outage"
cluster_stop "$DIR/send-outage"
pgbouncer_stop "$DIR"
rm -rf "$DIR"
mkdir -p "$DIR"
gofmt_clean() {
    local out
    out=$(gofmt -l .) || return 1
    [ -z "$out" ] && return 0
    echo "not gofmt-formatted: $out"
    return 1
}
step "gofmt" gofmt_clean
step "go vet" go vet ./...
step "staticcheck" go run "$STATICCHECK" ./...
export DEMO_BIN=$DIR/demo ORDERS_BIN=$DIR/orders
step "go build (the module and its demo app)" go build -o "$DEMO_BIN" ./cmd/demo
step "go build (the README's example app)" go build -o "$ORDERS_BIN" ./examples/orders

cleanup() {
    pgbouncer_stop "$DIR"
    cluster_stop "$DIR/send-outage"
    cluster_stop "$DIR/outage"
    cluster_stop "$DIR/pg"
}
trap cleanup EXIT
if ! cluster_start "$DIR/pg" "$PORT" "$LISTEN_TCP" || ! install_extension postgres -h "$DIR/pg/socket" -p "$PORT" -U postgres; then
    fail "a PostgreSQL $PG_MAJOR cluster with the extension ($IDEM_EDITION edition)"
    finish go-client
    exit 1
fi
if ! cluster_start "$DIR/outage" "$PORT" "listen_addresses = ''" ||
    ! install_extension postgres -h "$DIR/outage/socket" -p "$PORT" -U postgres; then
    fail "the second cluster (the example app's, restarted and stopped by its test)"
    finish go-client
    exit 1
fi
export GO_OUTAGE_URL="postgresql://postgres@/postgres?host=$DIR/outage/socket&port=$PORT"
export GO_OUTAGE_PGCTL=$PGBIN/pg_ctl GO_OUTAGE_DATA=$DIR/outage/data
if ! cluster_start "$DIR/send-outage" "$PORT" "listen_addresses = ''" ||
    ! install_extension postgres -h "$DIR/send-outage/socket" -p "$PORT" -U postgres; then
    fail "the third cluster (the sender's worker's, stopped and started by its test)"
    finish go-client
    exit 1
fi
export GO_SEND_OUTAGE_URL="postgresql://postgres@/postgres?host=$DIR/send-outage/socket&port=$PORT"
export GO_SEND_OUTAGE_DATA=$DIR/send-outage/data

# Runs go test -race -json with the given arguments and counts its tests that have no subtests
# (a parent's verdict only sums its subtests').
run_tests() { # run_tests NAME ARGS...
    local name=$1 json="$DIR/$1.json" counts status
    shift
    echo "== go test -race ($name)"
    go test -race -count=1 -json "$@" ./... >"$json"
    status=$?
    counts=$(/usr/bin/python3 - "$json" <<'EOF'
import json, sys
verdict, parents = {}, set()
for line in open(sys.argv[1]):
    try:
        e = json.loads(line)
    except ValueError:
        print(line, end="", file=sys.stderr)  # a build failure's text
        continue
    if e.get("Action") == "output" and e.get("Test") is None and "FAIL" in e.get("Output", ""):
        print(e["Output"], end="", file=sys.stderr)
    test = e.get("Test")
    if not test:
        continue
    name = e["Package"].rsplit("/", 1)[-1] + "." + test
    if "/" in test:
        parents.add(name.rsplit("/", 1)[0])
    if e["Action"] in ("pass", "fail", "skip"):
        verdict[name] = e["Action"]
    elif e["Action"] == "output" and (e["Output"].startswith(("    ", "---")) or "_test.go" in e["Output"]):
        print("    " + e["Output"].strip(), file=sys.stderr)
n = {"pass": 0, "fail": 0, "skip": 0}
for name, v in sorted(verdict.items()):
    if name in parents:
        continue
    n[v] += 1
    print(("ok  " if v == "pass" else v.upper()) + " " + name, file=sys.stderr)
print(n["pass"], n["fail"], n["skip"])
EOF
)
    read -r p f s <<<"$counts"
    p=${p:-0} f=${f:-0} s=${s:-0}
    [ "$status" -ne 0 ] && [ "$f" -eq 0 ] && f=1
    echo "$name: $p passed, $f failed, $s skipped"
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
}

DATABASE_URL="postgresql://postgres@127.0.0.1:$PORT/postgres" run_tests direct

echo "== pgbouncer (pool_mode = transaction) on port $BOUNCER_PORT"
if pgbouncer_start "$DIR" "$BOUNCER_PORT" "$PORT"; then
    DATABASE_URL="postgresql://postgres@127.0.0.1:$BOUNCER_PORT/postgres" run_tests pgbouncer -run 'TestClient|TestHTTP|TestDemo|TestRoundTrips|TestSenderSettings'
    admin() { psql -X -At -F ' ' -h 127.0.0.1 -p "$BOUNCER_PORT" -U postgres -d pgbouncer -c "$1"; }
    mode=$(admin "SHOW CONFIG" | awk '$1 == "pool_mode" { print $2 }')
    xacts=$(admin "SHOW STATS" | awk '$1 == "postgres" { print $2 }')
    echo "pgbouncer: pool_mode=$mode, transactions carried for database postgres: ${xacts:-none}"
    if [ "$mode" = transaction ] && [ "${xacts:-0}" -gt 100 ]; then
        ok "the pgbouncer run went through pgbouncer in transaction mode"
    else
        fail "the pgbouncer run went through pgbouncer in transaction mode"
    fi
else
    fail "pgbouncer started (see $DIR/pgbouncer.log)"
fi

echo "== examples/clients/go"
(cd "$ROOT/examples/clients/go" && DATABASE_URL="postgresql://postgres@127.0.0.1:$PORT/postgres" go run .) >"$DIR/example.log" 2>&1
cat "$DIR/example.log"
line=$(grep -E '^go: [0-9]+ passed, [0-9]+ failed$' "$DIR/example.log" | tail -1)
if [[ $line =~ ([0-9]+)\ passed,\ ([0-9]+)\ failed ]]; then
    passed=$((passed + BASH_REMATCH[1])); failed=$((failed + BASH_REMATCH[2]))
else
    fail "examples/clients/go" "no result line"
fi

finish go-client
