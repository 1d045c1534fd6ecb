#!/usr/bin/env bash
# The Go module as the Go module proxy will serve it (issue 33), used the way its README says:
#   1. the README's install blocks, as written: in the clone, scripts/build-artifacts.sh go
#      ~/idem-goproxy (go mod verify, no replace directive, the module zip made by the go
#      command from a git tag of the module's files); in an empty folder, a new project that
#      takes the module from that folder by its path and version (GOPROXY=file://...), its
#      dependencies from the Go proxy (a module cache of its own, so nothing comes from an
#      earlier download); HOME is a folder of this run
#   2. the zip holds the module's files and nothing else; the project's go.mod requires the
#      module's version with no replace directive; go mod verify; every package of the module
#      builds there, outside the repository
#   3. the README's example app (its block; go-client checks it is examples/orders/main.go)
#      copied in, go mod tidy, go build; run against a throwaway PostgreSQL 15 cluster with the
#      extension: a fresh request (201), the same again (replayed, the same bytes), the same key
#      with another body (422 problem), an invalid order (the handler's 422) and then the
#      corrected one with the same key (201), the database restarted under the idle app (the
#      next request 201), stopped (503 problem+json with Retry-After, within 2 s), started again
#      (the key refused meanwhile 201, once); no panic in the app's log
# Ports: tests/lib.sh's "artifacts-go" row (PostgreSQL +0, the example app +1); its folder
# dir_of artifacts-go. Needs the extension installed into PostgreSQL 15, and the Go proxy.
# Last line: "artifacts-go: N passed, M failed".
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/tests/lib.sh" || exit 2
export PATH="$PATH:/usr/local/go/bin"

port=$(port_of artifacts-go)
app_port=$((port + 1))
dir=$(dir_of artifacts-go)
module=github.com/idempotency/pg-idempotency-go

give_up() {
    fail "$1" "$2"
    finish artifacts-go
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
    [ -d "$dir/modcache" ] && chmod -R u+w "$dir/modcache" # the go command leaves it read-only
}
trap cleanup EXIT

if ! command -v go >/dev/null; then
    echo "skip artifacts-go: no Go toolchain here (go is not on PATH)"
    finish artifacts-go
    exit 0
fi
extension_installed || give_up "the extension" "not installed into PostgreSQL $PG_MAJOR (cargo pgrx install --release)"
cluster_stop "$dir/pg"
[ -d "$dir/modcache" ] && chmod -R u+w "$dir/modcache"
rm -rf "$dir"
mkdir -p "$dir/home" "$dir/new"
# A HOME of this run (the README's ~/idem-goproxy), a module cache of its own, and a build
# cache of this module's content: the go command takes a module version for immutable and
# keeps what it learned of it (its files' imports) in the build cache, but the clone's
# $version changes with every commit (a shared cache made the build miss a newly imported
# package: "could not import slices (open : no such file or directory)"). The first run of a
# content builds the standard library and the dependencies again (about 25 s).
content=$(cd "$root" && git ls-files --cached --others --exclude-standard -z -- clients/go |
    xargs -0 sha256sum | sha256sum | cut -c1-16)
caches=$root/target/artifacts-go-cache
find "$caches" -mindepth 1 -maxdepth 1 ! -name "$content" -exec rm -rf {} + 2>/dev/null
GOCACHE=$caches/$content
mkdir -p "$GOCACHE"
export GOCACHE HOME=$dir/home GOMODCACHE=$dir/modcache GOFLAGS="-modcacherw -buildvcs=false"

# readme_block MARKER [LANG]: the LANG (sh) block after the README line holding MARKER
readme_block() {
    /usr/bin/python3 - "$root/clients/go/README.md" "$1" "${2:-sh}" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(re.escape(sys.argv[2]) + r"[^\n]*\n```" + sys.argv[3] + r"\n(.*?)```\n", text, re.S)
sys.exit("no block after " + sys.argv[2]) if m is None else print(m.group(1), end="")
EOF
}

echo "== the README's install block, in the clone"
block=$(readme_block "artifacts-go: tests/artifacts/go.sh runs this block in the clone") || give_up "README.md" "no install block for the clone"
echo "$block"
if (cd "$root" && bash -euo pipefail -c "$block") >"$dir/build.log" 2>&1; then
    ok "scripts/build-artifacts.sh go: $(tail -1 "$dir/build.log")"
else
    tail -20 "$dir/build.log"
    give_up "scripts/build-artifacts.sh go" "see $dir/build.log"
fi
proxy=$HOME/idem-goproxy
version=v$(sed -n 's/^const Version = "\(.*\)"$/\1/p' "$root/clients/go/version.go")
zip=$proxy/$module/@v/$version.zip
check "the proxy folder lists the version" "$version" "$(cat "$proxy/$module/@v/list" 2>&1)"
check "the zip holds the module's files, nothing else" \
    "$(cd "$root" && git ls-files --cached --others --exclude-standard -- clients/go | sed 's|^clients/go/||' | sort)" \
    "$(unzip -Z1 "$zip" | sed "s|^$module@$version/||" | sort)"
check "the go.mod served has no replace directive" "" "$(grep -E '^[[:space:]]*replace([[:space:]]|\()' "$proxy/$module/@v/$version.mod")"
if grep -q "all modules verified" "$dir/build.log"; then
    ok "go mod verify (the module's dependencies)"
else
    fail "go mod verify (the module's dependencies)" "see $dir/build.log"
fi

echo "== the README's install block, in an empty folder"
block=$(readme_block "artifacts-go: tests/artifacts/go.sh runs this block in an empty folder") || give_up "README.md" "no install block for a new project"
echo "$block"
project=$dir/new/orders
if (cd "$dir/new" && bash -euo pipefail -c "$block") >"$dir/get.log" 2>&1; then
    ok "a new project gets $module@$version"
else
    tail -20 "$dir/get.log"
    give_up "the new project" "see $dir/get.log"
fi
# The rest runs in the project, with the environment the block set up.
GOPROXY="file://$proxy,$(cd "$dir" && env -u GOPROXY go env GOPROXY)"
export GOPROXY GONOSUMDB=$module
in_project() { (cd "$project" && "$@"); }
check "go.mod requires the module's version" "$version" "$(in_project go list -m -f '{{.Version}}' $module 2>&1)"
check "go.mod has no replace directive" "" "$(in_project go mod edit -json | grep -E '"Replace": \[')"
check_match "the module comes from the module cache, not the clone" "^$GOMODCACHE/" \
    "$(in_project go list -m -f '{{.Dir}}' $module 2>&1)"
readme_block "<!-- file: examples/orders/main.go -->" go >"$project/main.go" ||
    give_up "README.md" "no example app (<!-- file: examples/orders/main.go --> and a go block)"
if in_project go mod tidy >"$dir/tidy.log" 2>&1 && in_project go build -o "$dir/orders" . >>"$dir/tidy.log" 2>&1; then
    ok "the README's example app copied in ($(wc -l <"$project/main.go") lines): go mod tidy, go build"
else
    tail -20 "$dir/tidy.log"
    give_up "the example app" "see $dir/tidy.log"
fi
check "go mod verify in the project" "all modules verified" "$(in_project go mod verify 2>&1)"
check "the binary holds the module's version and the zip's hash" \
    "$module $version $(in_project go mod download -json $module@"$version" | sed -n 's/.*"Sum": "\(.*\)",/\1/p')" \
    "$(go version -m "$dir/orders" | awk -v m=$module '$1 == "dep" && $2 == m { print $2, $3, $4 }')"
if in_project go build $module/... >"$dir/build-all.log" 2>&1; then
    ok "every package of the module builds outside the repository"
else
    fail "every package of the module builds outside the repository" "$(tail -5 "$dir/build-all.log")"
fi

echo "== PostgreSQL $PG_MAJOR on port $port"
cluster_fresh "$dir/pg" "$port" "$LISTEN_TCP" || give_up "the cluster" "did not start"
install_extension postgres -h 127.0.0.1 -p "$port" -U postgres >"$dir/psql.log" 2>&1 ||
    { cat "$dir/psql.log"; give_up "CREATE EXTENSION idempotency" "failed"; }
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
problem_type() { /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["type"])' "$dir/body" 2>/dev/null; }
is_unavailable() { # the 503 problem with Retry-After
    [ "$status" = 503 ] && [[ $(header content-type) == application/problem+json* ]] &&
        [ "$(problem_type)" = urn:pg-idempotency:problem:service-unavailable ] && [[ $(header retry-after) =~ ^[1-9][0-9]*$ ]]
}
orders() { psql -X -At -h 127.0.0.1 -p "$port" -U postgres -d postgres -c "SELECT count(*) FROM orders WHERE item = '$1'"; }

echo "== the example app, as built in the project"
log=$dir/orders.log
(cd "$project" && exec env DATABASE_URL="postgresql://postgres@127.0.0.1:$port/postgres" \
    LISTEN_ADDR="127.0.0.1:$app_port" "$dir/orders" >"$log" 2>&1) &
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
check "one order" 1 "$(orders book)"
key=v-$RANDOM-$RANDOM
post "$key" '{"item": "bag", "quantity": 0}'
check "an invalid order: the handler's 422" "422 about:blank" "$status $(problem_type)"
post "$key" '{"item": "bag", "quantity": 2}'
check "the corrected order with the same key" "201 " "$status $(header idempotent-replayed)"

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
check "its one order" 1 "$(orders cup)"
check "no panic in the app's log" "" "$(grep -i -m3 panic "$log")"
stop_app

finish artifacts-go
