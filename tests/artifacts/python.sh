#!/usr/bin/env bash
# The Python package as PyPI will ship it (issue 33), used the way its README says:
#   1. scripts/build-artifacts.sh python: the wheel and the sdist (python -m build)
#   2. a fresh project in a temp folder, outside the clone: a new venv, the wheel installed from
#      the built file with the extras [fastapi,sqlalchemy] and uvicorn, its dependencies from
#      PyPI (pinned by clients/python/constraints.txt); psycopg's binary build is what it got
#   3. the README's example apps copied in (examples/orders.py, examples/orders_sqlalchemy.py),
#      each run under that venv's uvicorn against a throwaway PostgreSQL 15 cluster with the
#      extension: a fresh request (201), the same again (replayed, the same bytes), the same key
#      with another body (422 problem), the database restarted under the idle app (the next
#      request 201), stopped (503 problem+json with Retry-After, within 2 s), started again (the
#      key refused meanwhile 201, once); nothing unhandled in the app's log
#   4. the sdist installed into another fresh venv (pip builds it): the same modules as the wheel
# Ports: tests/lib.sh's "artifacts-python" row (PostgreSQL +0, the example app +1); its folder
# dir_of artifacts-python. Needs the extension installed into PostgreSQL 15, and PyPI.
# Last line: "artifacts-python: N passed, M failed".
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/tests/lib.sh" || exit 2

port=$(port_of artifacts-python)
app_port=$((port + 1))
dir=$(dir_of artifacts-python)
py=${IDEM_PY_BASE_PYTHON:-python3}
constraints=$root/clients/python/constraints.txt
export PIP_DISABLE_PIP_VERSION_CHECK=1

give_up() {
    fail "$1" "$2"
    finish artifacts-python
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

echo "== scripts/build-artifacts.sh python $dir/dist"
"$root/scripts/build-artifacts.sh" python "$dir/dist" 2>"$dir/build.log" || { tail -20 "$dir/build.log"; give_up "build" "see $dir/build.log"; }
wheel=$(ls "$dir"/dist/pg_idempotency-*-py3-none-any.whl 2>/dev/null)
sdist=$(ls "$dir"/dist/pg_idempotency-*.tar.gz 2>/dev/null)
if [ -f "$wheel" ] && [ -f "$sdist" ]; then ok "a wheel and an sdist built: $(basename "$wheel") $(basename "$sdist")"; else give_up "build" "no wheel or sdist in $dir/dist"; fi
check "the wheel holds the package and its metadata only" "" \
    "$(unzip -Z1 "$wheel" | grep -vE '^pg_idempotency/[a-z_]+\.py$|^pg_idempotency-[^/]+\.dist-info/')"

echo "== a fresh project: $dir/project, the wheel installed from its file"
project=$dir/project
mkdir -p "$project"
if "$py" -m venv "$project/venv" &&
    "$project/venv/bin/pip" install -q -c "$constraints" "${wheel}[fastapi,sqlalchemy]" uvicorn >"$dir/pip-wheel.log" 2>&1; then
    ok "pip install the wheel [fastapi,sqlalchemy] and uvicorn into a fresh venv"
else
    tail -20 "$dir/pip-wheel.log"
    give_up "pip install the wheel" "see $dir/pip-wheel.log"
fi
check "the extras bring psycopg's binary build" "binary" \
    "$("$project/venv/bin/python" -c 'import psycopg; print(psycopg.pq.__impl__)' 2>&1)"
check_match "pg_idempotency imported from the venv, not the clone" "^$project/venv/lib/python[0-9.]+/site-packages/" \
    "$(cd "$project" && venv/bin/python -c 'import pg_idempotency; print(pg_idempotency.__file__)' 2>&1)"
cp "$root/clients/python/examples/orders.py" "$root/clients/python/examples/orders_sqlalchemy.py" "$project/"

echo "== PostgreSQL $PG_MAJOR on port $port"
cluster_fresh "$dir/pg" "$port" "$LISTEN_TCP" || give_up "the cluster" "did not start"
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
problem_type() { "$project/venv/bin/python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["type"])' "$dir/body" 2>/dev/null; }
is_unavailable() { # the 503 problem with Retry-After
    [ "$status" = 503 ] && [[ $(header content-type) == application/problem+json* ]] &&
        [ "$(problem_type)" = urn:pg-idempotency:problem:service-unavailable ] && [[ $(header retry-after) =~ ^[1-9][0-9]*$ ]]
}

run_example() { # run_example MODULE URL_SCHEME
    local module=$1 scheme=$2 db key first log
    db=art_${module}
    fresh_database "$db" -h 127.0.0.1 -p "$port" -U postgres >"$dir/$db.psql.log" 2>&1 ||
        { cat "$dir/$db.psql.log"; fail "$module: database" "not made"; return; }
    log=$dir/$module.log
    (cd "$project" && exec env DATABASE_URL="$scheme://postgres@127.0.0.1:$port/$db" \
        venv/bin/uvicorn "$module:app" --host 127.0.0.1 --port "$app_port" >"$log" 2>&1) &
    app_pid=$!
    for _ in $(seq 150); do
        curl -s -o /dev/null "http://127.0.0.1:$app_port/" && break
        sleep 0.2
    done
    key=k-$RANDOM-$RANDOM
    post "$key" '{"item": "book", "quantity": 1}'
    check "$module: a fresh request" 201 "$status"
    first=$(cat "$dir/body")
    post "$key" '{"item": "book", "quantity": 1}'
    check "$module: the same request again, replayed" "201 true $first" "$status $(header idempotent-replayed) $(cat "$dir/body")"
    post "$key" '{"item": "pen", "quantity": 1}'
    check "$module: the same key with another body" "422 urn:pg-idempotency:problem:idempotency-key-reused" "$status $(problem_type)"
    check "$module: one order" 1 "$(psql -X -At -h 127.0.0.1 -p "$port" -U postgres -d "$db" -c 'SELECT count(*) FROM orders')"

    pg_ctl_as -m fast restart
    post "k-$RANDOM-$RANDOM" '{"item": "lamp", "quantity": 1}'
    check "$module: the database restarted under the idle app, the next request" 201 "$status"

    pg_ctl_as -m fast stop
    key=k-$RANDOM-$RANDOM
    post "$key" '{"item": "cup", "quantity": 2}'
    if is_unavailable && awk -v t="$took" 'BEGIN { exit !(t < 2) }'; then
        ok "$module: the database stopped: 503 problem+json, Retry-After $(header retry-after), in $took s"
    else
        fail "$module: the database stopped" "expected 503 problem+json with Retry-After within 2 s, got $status in $took s: $(head -c 300 "$dir/body")"
    fi
    pg_ctl_as start
    for _ in $(seq 30); do
        post "$key" '{"item": "cup", "quantity": 2}'
        [ "$status" = 503 ] || break
        sleep "$(header retry-after)"
    done
    check "$module: started again, the key refused meanwhile" "201 " "$status $(header idempotent-replayed)"
    check "$module: its one order" 1 \
        "$(psql -X -At -h 127.0.0.1 -p "$port" -U postgres -d "$db" -c "SELECT count(*) FROM orders WHERE item = 'cup'")"
    check "$module: nothing unhandled in the app's log" "" \
        "$(grep -E 'Traceback|Exception in ASGI application' "$log" | head -3)"
    stop_app
}

echo "== the README's example apps, as copied into the project"
run_example orders postgresql
run_example orders_sqlalchemy postgresql+psycopg

echo "== the sdist into another fresh venv"
if "$py" -m venv "$dir/sdist-venv" &&
    "$dir/sdist-venv/bin/pip" install -q -c "$constraints" "${sdist}[fastapi,sqlalchemy]" >"$dir/pip-sdist.log" 2>&1; then
    ok "pip install the sdist [fastapi,sqlalchemy] (built by pip)"
else
    tail -20 "$dir/pip-sdist.log"
    fail "pip install the sdist" "see $dir/pip-sdist.log"
fi
modules='import importlib.metadata as m; print(" ".join(sorted(str(f) for f in m.files("pg-idempotency") if f.suffix == ".py")))'
check "the sdist installs the wheel's modules" "$("$project/venv/bin/python" -c "$modules")" \
    "$("$dir/sdist-venv/bin/python" -c "$modules" 2>&1)"
check "the sdist's package imports" ok \
    "$("$dir/sdist-venv/bin/python" -c 'import pg_idempotency.asgi, pg_idempotency.sqlalchemy, pg_idempotency.fastapi; print("ok")' 2>&1)"

finish artifacts-python
