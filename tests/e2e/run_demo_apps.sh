#!/usr/bin/env bash
# The black-box HTTP suite (tests/e2e/run.py) against every client package's demo app, one
# after the other: Rust (clients/rust examples/demo), Python (FastAPI and Django), Node
# (Express and Fastify), Go (clients/go cmd/demo, built here with `go build`), Java
# (clients/java demo, built here with mvn). An app whose runtime is not set up here (the
# package's own test.sh builds it: cargo, the venv clients/python/.venv or $IDEM_PY_PYTHON,
# clients/node/node_modules; go on PATH; java and mvn) is skipped with the reason, never
# counted as passed.
# Needs the extension installed into PostgreSQL 15. Ports: E2E_APPS_PORT (default: tests/lib.sh's
# "e2e-apps" row) to +3.
# Last line: "e2e-apps: N passed, M failed".
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/tests/lib.sh" || exit 2
port=${E2E_APPS_PORT:-$(port_of e2e-apps)}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target/clients}
export PATH="$HOME/.cargo/bin:$PATH:/usr/local/go/bin"
passed=0
failed=0
skipped=0
args='--listen {listen} --database-url {database_url} --lease-ms {lease_ms} --allow-fault-injection'

skip() { skipped=$((skipped + 1)); echo "skip e2e-$1: $2"; }

run_app() { # run_app NAME COMMAND
    local name=$1 cmd=$2 log line
    log=$(mktemp)
    /usr/bin/python3 "$root/tests/e2e/run.py" --port "$port" --name "e2e-$name" --app-cmd "$cmd $args" 2>&1 | tee "$log"
    line=$(grep -E "^e2e-$name: [0-9]+ passed, [0-9]+ failed$" "$log" | tail -1)
    rm -f "$log"
    if [[ $line =~ ([0-9]+)\ passed,\ ([0-9]+)\ failed ]]; then
        passed=$((passed + BASH_REMATCH[1])); failed=$((failed + BASH_REMATCH[2]))
    else
        failed=$((failed + 1)); echo "FAIL e2e-$name: no result line"
    fi
}

if cargo build --locked --quiet --example demo --manifest-path "$root/clients/rust/Cargo.toml"; then
    run_app rust-demo "$CARGO_TARGET_DIR/debug/examples/demo"
else
    failed=$((failed + 1)); echo "FAIL e2e-rust-demo: the demo app does not build"
fi

py=${IDEM_PY_PYTHON:-$root/clients/python/.venv/bin/python}
if [ -x "$py" ]; then
    export IDEM_PY_PYTHON=$py
    run_app python-asgi "$root/clients/python/demo/run-asgi"
    run_app python-django "$root/clients/python/demo/run-django"
else
    skip python "no venv at $py (clients/python/test.sh makes it)"
fi

for app in express fastify; do
    if [ -d "$root/clients/node/node_modules/$app" ]; then
        run_app "node-$app" "node $root/clients/node/demo/$app.js"
    else
        skip "node-$app" "clients/node/node_modules/$app is missing (clients/node/test.sh runs npm ci)"
    fi
done

if ! command -v go >/dev/null; then
    skip go "no Go toolchain here (go is not on PATH)"
elif mkdir -p "$CARGO_TARGET_DIR" && (cd "$root/clients/go" && go build -o "$CARGO_TARGET_DIR/go-demo" ./cmd/demo); then
    run_app go "$CARGO_TARGET_DIR/go-demo"
else
    failed=$((failed + 1)); echo "FAIL e2e-go: the demo app does not build"
fi

if command -v java >/dev/null && command -v mvn >/dev/null; then
    # (Maven 3.8 prints colour resets even in batch mode: dropped.)
    if (cd "$root/clients/java" && mvn -B -q -ntp package -DskipTests 2>&1 | sed 's/\x1b\[[0-9;]*m//g'); then
        run_app java-demo "java -jar $root/clients/java/demo/target/idempotency-demo.jar"
    else
        failed=$((failed + 1)); echo "FAIL e2e-java-demo: the demo app does not build"
    fi
else
    skip java-demo "no java or mvn here (scripts/install-deps.sh installs OpenJDK 17 and Maven)"
fi

[ "$skipped" -gt 0 ] && echo "($skipped demo apps skipped)"
echo "e2e-apps: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
