#!/usr/bin/env bash
# The Node package as npm will ship it (issue 33), used the way its README says:
#   1. scripts/build-artifacts.sh node: the tarball (npm pack)
#   2. a fresh npm project in a temp folder, outside the clone: the tarball copied into its
#      vendor/, the README's install block run as it is (the tarball, with pg and express from the
#      registry), then a later plain `npm install express`, after which the package still loads
#   3. the README's example app, examples/express-app.mjs as the tarball ships it, run there
#      against a throwaway PostgreSQL 15 cluster with the extension: a fresh request (201), the
#      same again (replayed, the same bytes), the same key with another body (422 problem), the
#      database restarted under the idle app (the next request 201), stopped (503 problem+json
#      with Retry-After, within 2 s), started again (the key refused meanwhile 201, once); the app
#      still running, nothing unhandled in its log
# Ports: tests/lib.sh's "artifacts-node" row (PostgreSQL +0, the example app +1); its folder
# dir_of artifacts-node. Needs the extension installed into PostgreSQL 15, and the npm registry.
# Last line: "artifacts-node: N passed, M failed".
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/tests/lib.sh" || exit 2

port=$(port_of artifacts-node)
app_port=$((port + 1))
dir=$(dir_of artifacts-node)
export npm_config_audit=false npm_config_fund=false npm_config_update_notifier=false

give_up() {
    fail "$1" "$2"
    finish artifacts-node
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
cluster_stop "$dir/pg"
rm -rf "$dir"
mkdir -p "$dir"

echo "== scripts/build-artifacts.sh node $dir/dist"
"$root/scripts/build-artifacts.sh" node "$dir/dist" >"$dir/build.out" 2>"$dir/build.log" ||
    { tail -20 "$dir/build.log"; give_up "build" "see $dir/build.log"; }
tarball=$(tail -1 "$dir/build.out")
if [ -f "$tarball" ]; then ok "the tarball built: $(basename "$tarball")"; else give_up "build" "no tarball in $dir/dist"; fi
check "the tarball holds the package, its README, types and example apps only" "" \
    "$(tar -tzf "$tarball" | grep -vE '^package/(src/[a-z-]+\.js|examples/[a-z-]+\.mjs|package\.json|README\.md|index\.d\.ts)$')"

echo "== a fresh project: $dir/project, the README's install block"
project=$dir/project
install_block=$(awk '/^<!-- install:/ { getline; inside = 1; next } inside && /^```/ { exit } inside' "$root/clients/node/README.md")
[ -n "$install_block" ] || give_up "the README's install block" "not found (<!-- install: ... --> then a sh block)"
check "the install block names the tarball the build makes" "./vendor/$(basename "$tarball")" \
    "$(grep -o '\./vendor/[^ ]*\.tgz' <<<"$install_block")"
mkdir -p "$project/vendor"
cp "$tarball" "$project/vendor/"
if (cd "$project" && npm init -y >/dev/null && eval "$install_block") >"$dir/npm-install.log" 2>&1; then
    ok "npm init, then as the README says: $install_block"
else
    tail -20 "$dir/npm-install.log"
    give_up "npm install the tarball" "see $dir/npm-install.log"
fi
check "package.json records the tarball inside the project" "file:vendor/$(basename "$tarball")" \
    "$(cd "$project" && node -p 'require("./package.json").dependencies["pg-idempotency"]')"
if (cd "$project" && npm install express) >>"$dir/npm-install.log" 2>&1; then
    ok "a later plain npm install express"
else
    tail -20 "$dir/npm-install.log"
    fail "a later plain npm install express" "see $dir/npm-install.log"
fi
check "pg-idempotency loads from the project (its dependencies there too), not from the clone" \
    "function $project/node_modules/pg-idempotency/src/index.js" \
    "$(cd "$project" && node --input-type=module -e "
        const m = await import('pg-idempotency');
        console.log(typeof m.createIdempotency, (await import.meta.resolve('pg-idempotency')).replace('file://', ''));" 2>&1)"
example=$project/node_modules/pg-idempotency/examples/express-app.mjs
check "the example app the tarball ships is the README's (examples/express-app.mjs)" "" \
    "$(diff "$root/clients/node/examples/express-app.mjs" "$example" 2>&1)"
cp "$example" "$project/"

echo "== PostgreSQL $PG_MAJOR on port $port"
cluster_fresh "$dir/pg" "$port" "$LISTEN_TCP" || give_up "the cluster" "did not start"
fresh_database app -h 127.0.0.1 -p "$port" -U postgres >"$dir/psql.log" 2>&1 || { cat "$dir/psql.log"; give_up "the database" "not made"; }
pg_ctl_as() { as_postgres "$PGBIN/pg_ctl" -D "$dir/pg/data" -l "$dir/pg/server.log" -w "$@" >/dev/null; }
orders() { psql -X -At -h 127.0.0.1 -p "$port" -U postgres -d app -c "SELECT count(*) FROM orders WHERE item = '$1'"; }

# post KEY BODY: POST /orders; sets status, took (seconds), and the files $dir/headers, $dir/body
post() {
    local out
    out=$(curl -sS -o "$dir/body" -D "$dir/headers" -w '%{http_code} %{time_total}' --max-time 30 \
        -H 'Content-Type: application/json' -H "Idempotency-Key: \"$1\"" \
        -d "$2" "http://127.0.0.1:$app_port/orders" 2>&1) || out="000 0"
    read -r status took <<<"$out"
}
header() { tr -d '\r' <"$dir/headers" | sed -n "s/^$1: //Ip" | head -1; }
problem_type() { node -e 'console.log(JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")).type)' "$dir/body" 2>/dev/null; }
is_unavailable() { # the 503 problem with Retry-After
    [ "$status" = 503 ] && [[ $(header content-type) == application/problem+json* ]] &&
        [ "$(problem_type)" = urn:pg-idempotency:problem:service-unavailable ] && [[ $(header retry-after) =~ ^[1-9][0-9]*$ ]]
}
app_alive() { [ -n "$app_pid" ] && kill -0 "$app_pid" 2>/dev/null; }

echo "== the README's example app, node express-app.mjs, in the project"
log=$dir/express-app.log
(cd "$project" && exec env DATABASE_URL="postgresql://postgres@127.0.0.1:$port/app" PORT="$app_port" \
    node express-app.mjs >"$log" 2>&1) &
app_pid=$!
for _ in $(seq 150); do
    curl -s -o /dev/null "http://127.0.0.1:$app_port/" && break
    app_alive || break
    sleep 0.2
done
app_alive || { cat "$log"; give_up "the example app" "exited at start"; }

key=k-$RANDOM-$RANDOM
post "$key" '{"item": "book"}'
check "a fresh request" 201 "$status"
first=$(cat "$dir/body")
post "$key" '{"item": "book"}'
check "the same request again, replayed" "201 true $first" "$status $(header idempotent-replayed) $(cat "$dir/body")"
post "$key" '{"item": "pen"}'
check "the same key with another body" "422 urn:pg-idempotency:problem:idempotency-key-reused" "$status $(problem_type)"
check "one order" 1 "$(orders book)"

pg_ctl_as -m fast restart
post "k-$RANDOM-$RANDOM" '{"item": "lamp"}'
check "the database restarted under the idle app, the next request" 201 "$status"

pg_ctl_as -m fast stop
key=k-$RANDOM-$RANDOM
post "$key" '{"item": "cup"}'
if is_unavailable && awk -v t="$took" 'BEGIN { exit !(t < 2) }'; then
    ok "the database stopped: 503 problem+json, Retry-After $(header retry-after), in $took s"
else
    fail "the database stopped" "expected 503 problem+json with Retry-After within 2 s, got $status in $took s: $(head -c 300 "$dir/body")"
fi
pg_ctl_as start
for _ in $(seq 30); do
    post "$key" '{"item": "cup"}'
    [ "$status" = 503 ] || break
    sleep "$(header retry-after)"
done
check "started again, the key refused meanwhile" "201 " "$status $(header idempotent-replayed)"
check "its one order" 1 "$(orders cup)"
if app_alive; then ok "the app outlived the restart and the stop"; else fail "the app outlived the restart and the stop" "it exited: $(tail -5 "$log")"; fi
check "nothing unhandled in the app's log" "" "$(grep -E 'Unhandled|Uncaught|^[[:space:]]+at ' "$log" | head -3)"
stop_app

finish artifacts-node
