#!/usr/bin/env bash
# The Rust crate as crates.io will ship it (issue 33), used the way its README says:
#   1. scripts/build-artifacts.sh rust: the .crate (cargo package, which builds the packed files
#      on their own first)
#   2. the .crate unpacked in a folder of its own, as a registry serves its contents (its
#      Cargo.toml normalized by cargo package, no path back into the clone)
#   3. a fresh crate in another folder (cargo new), outside the clone: the README's `cargo add`
#      lines, pg-idempotency by path to the unpacked crate (the README's "until it is
#      published"), the others from crates.io at the versions of the packed Cargo.lock; the
#      README's example app copied in from the unpacked crate (examples/orders.rs) as
#      src/main.rs; built
#   4. run against a throwaway PostgreSQL 15 cluster with the extension: a fresh request (201),
#      the same again (replayed, the same bytes), the same key with another body (422 problem),
#      the database restarted under the idle app (the next request 201), stopped (503
#      problem+json with Retry-After, within 2 s), started again (the key refused meanwhile 201,
#      once); no panic in the app's log
# Build output: target/artifacts-rust for the fresh crate, target/clients for cargo package's
# own build (both kept across runs: dependencies are built once). Measured on two shared cores:
# cold, cargo package 60 s and the fresh crate 103 s, the suite about 3 minutes; warm, 21-29 s. Ports: tests/lib.sh's "artifacts-rust"
# row (PostgreSQL +0, the example app +1); its folder dir_of artifacts-rust. Needs the extension
# installed into PostgreSQL 15, and crates.io. Last line: "artifacts-rust: N passed, M failed".
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/tests/lib.sh" || exit 2
export PATH="$HOME/.cargo/bin:$PATH"

port=$(port_of artifacts-rust)
app_port=$((port + 1))
dir=$(dir_of artifacts-rust)
export CARGO_TARGET_DIR=$root/target/artifacts-rust

give_up() {
    fail "$1" "$2"
    finish artifacts-rust
    exit 1
}

app_pid=""
stop_app() {
    [ -n "$app_pid" ] && kill "$app_pid" 2>/dev/null && wait "$app_pid" 2>/dev/null
    app_pid=""
}
cleanup() {
    stop_app
    cluster_stop "$dir/pg"
}
trap cleanup EXIT

extension_installed || give_up "the extension" "not installed into PostgreSQL $PG_MAJOR (cargo pgrx install --release)"
rm -rf "$dir"
mkdir -p "$dir"

echo "== scripts/build-artifacts.sh rust $dir/dist"
began=$SECONDS
CARGO_TARGET_DIR=$root/target/clients "$root/scripts/build-artifacts.sh" rust "$dir/dist" 2>"$dir/build.log" ||
    { tail -20 "$dir/build.log"; give_up "build" "see $dir/build.log"; }
crate=$(ls "$dir"/dist/pg-idempotency-*.crate 2>/dev/null)
[ -f "$crate" ] || give_up "build" "no .crate in $dir/dist"
ok "cargo package: $(basename "$crate") ($((SECONDS - began)) s)"

echo "== the .crate unpacked in $dir/unpacked"
mkdir -p "$dir/unpacked"
# -m, as the README says: the .crate's one fixed old file time would keep cargo from rebuilding
# the path dependency in target/artifacts-rust after a change.
tar -xzmf "$crate" -C "$dir/unpacked" || give_up "unpack" "tar -xzmf $crate"
pkg=$dir/unpacked/$(basename "$crate" .crate)
check "it holds the crate's sources, examples and README, nothing else" "" \
    "$(cd "$pkg" && find . -type f | sed 's|^\./||' | grep -vE '^(src/[a-z_]+\.rs|examples/[a-z_]+\.rs|tests/(common/)?[a-z_]+\.rs|README\.md|Cargo\.toml|Cargo\.toml\.orig|Cargo\.lock|\.gitignore|\.cargo_vcs_info\.json)$')"
check "its Cargo.toml has no path into the clone" "" "$(grep -n 'path *= *"\.\.' "$pkg/Cargo.toml")"

echo "== a fresh crate in $dir/project, depending on the unpacked one by path"
project=$dir/project
cargo new --quiet --name orders-app "$project" || give_up "cargo new" "failed"
# The versions the crate was packed with (its Cargo.lock), so the build is the tested one and
# target/artifacts-rust keeps serving it.
cp "$pkg/Cargo.lock" "$project/Cargo.lock"
adds=$(awk '/^```sh/ { block++; next } /^```/ { if (block == 1) exit } block == 1 && /^cargo add / { print }' \
    "$root/clients/rust/README.md")
[ -n "$adds" ] || give_up "README.md" "no cargo add lines in its first sh block"
while read -r line; do
    [[ $line == "cargo add pg-idempotency "* ]] && line="cargo add pg-idempotency --path $pkg"
    echo "+ $line"
    (cd "$project" && eval "$line") >>"$dir/cargo-add.log" 2>&1 || { tail -5 "$dir/cargo-add.log"; give_up "$line" "failed"; }
done <<<"$adds"
ok "the README's cargo add lines, pg-idempotency by path to the unpacked crate"
cp "$pkg/examples/orders.rs" "$project/src/main.rs"
check "the example app copied in is the repository's examples/orders.rs" "" \
    "$(diff "$root/clients/rust/examples/orders.rs" "$project/src/main.rs")"
began=$SECONDS
if (cd "$project" && cargo build) >"$dir/cargo-build.log" 2>&1; then
    ok "cargo build of the fresh crate ($((SECONDS - began)) s, target dir $CARGO_TARGET_DIR)"
else
    tail -30 "$dir/cargo-build.log"
    give_up "cargo build" "see $dir/cargo-build.log"
fi
check "pg-idempotency was built from the unpacked crate" "1" \
    "$(cd "$project" && cargo metadata --format-version 1 --offline 2>/dev/null |
        grep -o "\"manifest_path\":\"$pkg/Cargo.toml\"" | wc -l)"
check "and built again from it in this run (not an earlier run's build)" "yes" \
    "$(grep -q "Compiling pg-idempotency v[^ ]* ($pkg)" "$dir/cargo-build.log" && echo yes)"

echo "== PostgreSQL $PG_MAJOR on port $port"
cluster_fresh "$dir/pg" "$port" "$LISTEN_TCP" || give_up "the cluster" "did not start"
fresh_database orders -h 127.0.0.1 -p "$port" -U postgres >"$dir/psql.log" 2>&1 ||
    { cat "$dir/psql.log"; give_up "database" "not made"; }
pg_ctl_as() { as_postgres "$PGBIN/pg_ctl" -D "$dir/pg/data" -l "$dir/pg/server.log" -w "$@" >/dev/null; }

# post KEY BODY: POST /orders; sets status, took (seconds), and the files $dir/headers, $dir/body
post() {
    local out
    out=$(curl -sS -o "$dir/body" -D "$dir/headers" -w '%{http_code} %{time_total}' --max-time 30 \
        -H 'Content-Type: application/json' -H 'X-Api-Key: acct_artifacts' -H "Idempotency-Key: \"$1\"" \
        -d "$2" "http://127.0.0.1:$app_port/orders" 2>&1) || out="000 0"
    read -r status took <<<"$out"
}
header() { tr -d '\r' <"$dir/headers" | sed -n "s/^$1: //Ip" | head -1; }
problem_type() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["type"])' "$dir/body" 2>/dev/null; }
is_unavailable() { # the 503 problem with Retry-After
    [ "$status" = 503 ] && [[ $(header content-type) == application/problem+json* ]] &&
        [ "$(problem_type)" = urn:pg-idempotency:problem:service-unavailable ] && [[ $(header retry-after) =~ ^[1-9][0-9]*$ ]]
}
orders_of() { psql -X -At -h 127.0.0.1 -p "$port" -U postgres -d orders -c "SELECT count(*) FROM orders WHERE item = '$1'"; }

echo "== the README's example app, built in the fresh crate, on port $app_port"
log=$dir/orders-app.log
DATABASE_URL="postgresql://postgres@127.0.0.1:$port/orders" LISTEN="127.0.0.1:$app_port" \
    "$CARGO_TARGET_DIR/debug/orders-app" >"$log" 2>&1 &
app_pid=$!
for _ in $(seq 150); do
    curl -s -o /dev/null "http://127.0.0.1:$app_port/" && break
    sleep 0.2
done
key=k-$RANDOM-$RANDOM
post "$key" '{"item": "book", "quantity": 1}'
check "a fresh request" 201 "$status"
first=$(cat "$dir/body")
post "$key" '{"item": "book", "quantity": 1}'
check "the same request again, replayed" "201 true $first" "$status $(header idempotent-replayed) $(cat "$dir/body")"
post "$key" '{"item": "pen", "quantity": 1}'
check "the same key with another body" "422 urn:pg-idempotency:problem:idempotency-key-reused" "$status $(problem_type)"
check "one order" 1 "$(orders_of book)"

pg_ctl_as -m fast restart
post "k-$RANDOM-$RANDOM" '{"item": "lamp", "quantity": 1}'
check "the database restarted under the idle app, the next request" 201 "$status"

pg_ctl_as -m fast stop
key=k-$RANDOM-$RANDOM
post "$key" '{"item": "cup", "quantity": 2}'
if is_unavailable && awk -v t="$took" 'BEGIN { exit !(t < 2) }'; then
    ok "the database stopped: 503 problem+json, Retry-After $(header retry-after), in $took s"
else
    fail "the database stopped" "expected 503 problem+json with Retry-After within 2 s, got $status in $took s: $(head -c 300 "$dir/body")"
fi
pg_ctl_as start
for _ in $(seq 30); do
    post "$key" '{"item": "cup", "quantity": 2}'
    [ "$status" = 503 ] || break
    sleep "$(header retry-after)"
done
check "started again, the key refused meanwhile" "201 " "$status $(header idempotent-replayed)"
check "its one order" 1 "$(orders_of cup)"
check "the app lives on, no panic in its log" "yes " "$(kill -0 "$app_pid" 2>/dev/null && echo yes) $(grep -m3 panicked "$log")"
stop_app

finish artifacts-rust
