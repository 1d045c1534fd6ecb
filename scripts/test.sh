#!/usr/bin/env bash
# Command 2 of the README: the whole test suite, on a fresh Debian 12 machine as root.
#   1. Rust unit tests of the pure modules and in-process #[pg_test]s (cargo pgrx test)
#   2. the extension built and installed, a throwaway cluster started
#   3. the pg_regress suite and the isolationtester specs against it (make -C tests installcheck)
#   4. pg_cron scheduling the sweep on a cluster of its own (tests/pg_cron/run.sh)
#      releases and upgrades: frozen release scripts, ALTER EXTENSION UPDATE (tests/upgrade/run.sh)
#   5. the dead-worker completer example's self-test (examples/completer.py --self-test)
#   6. a 20 s stress run of 32 sessions with killed backends and one server crash
#      (tests/stress/stress.py; STRESS_SECONDS=120 scripts/test.sh for a longer one)
#   7. security: privileges, RLS, search_path, dumps, a standby, huge input (tests/security/run.sh)
#   8. the example service end to end (tests/e2e/run.sh) and the client examples
#      (tests/clients/run_examples.sh)
#   9. Citus, where it is installed (tests/citus/run.sh; skipped with a message otherwise)
#  10. a smoke run of the benchmark scripts (bench/run.sh --smoke)
# Ends with one line "total: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

TEST_DIR=${TEST_DIR:-/tmp/idempotency-test}
TEST_PORT=${TEST_PORT:-54330}
PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config
LOGS=$ROOT/target/test-logs
passed=0
failed=0
broken=()

scripts/install-deps.sh || { echo "install-deps failed"; exit 1; }
export PATH="$HOME/.cargo/bin:$PATH"
mkdir -p "$LOGS"

# Adds a suite's counts from its log. Three summary forms are understood:
#   cargo:       "test result: ok. 42 passed; 0 failed; ..."   (every such line counts)
#   pg_regress:  "All 9 tests passed."  or  "2 of 9 tests failed."
#   our own:     "stress: 5 passed, 0 failed"   (the last such line is the suite's total)
count() {
    local name=$1 log=$2 status=$3 p=0 f=0 own_p=0 own_f=0 line
    while read -r line; do
        if [[ $line =~ test\ result:\ [a-zA-Z]+\.\ ([0-9]+)\ passed\;\ ([0-9]+)\ failed ]]; then
            p=$((p + BASH_REMATCH[1])); f=$((f + BASH_REMATCH[2]))
        elif [[ $line =~ All\ ([0-9]+)\ tests\ passed ]]; then
            p=$((p + BASH_REMATCH[1]))
        elif [[ $line =~ ([0-9]+)\ of\ ([0-9]+)\ tests\ failed ]]; then
            p=$((p + BASH_REMATCH[2] - BASH_REMATCH[1])); f=$((f + BASH_REMATCH[1]))
        elif [[ $line =~ ^[a-z0-9_-]+:\ ([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
            own_p=${BASH_REMATCH[1]}; own_f=${BASH_REMATCH[2]}
        fi
    done < "$log"
    p=$((p + own_p)); f=$((f + own_f))
    # A suite that failed without saying how many counts as one failure.
    if [ "$status" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    passed=$((passed + p))
    failed=$((failed + f))
    [ "$status" -ne 0 ] && broken+=("$name (log: $log)")
    echo "== $name: $p passed, $f failed"
}

run() {
    local name=$1; shift
    echo "== $name"
    "$@" 2>&1 | tee "$LOGS/$name.log"
    count "$name" "$LOGS/$name.log" "${PIPESTATUS[0]}"
}

pgrx_tests() {
    rm -rf /tmp/idempotency-pgrx-test
    cargo pgrx test pg15 --runas postgres --pgdata /tmp/idempotency-pgrx-test
}
run unit-and-in-process pgrx_tests

# cargo pgrx test installed its test build; install the real one over it.
echo "== building and installing the extension (release)"
if ! cargo pgrx install --release --pg-config "$PG_CONFIG" >"$LOGS/install.log" 2>&1; then
    cat "$LOGS/install.log"
    echo "total: $passed passed, $((failed + 1)) failed"
    exit 1
fi

scripts/cluster.sh stop "$TEST_DIR"
rm -rf "$TEST_DIR"
scripts/cluster.sh start "$TEST_DIR" "$TEST_PORT"
trap 'scripts/cluster.sh stop "$TEST_DIR"' EXIT
export PGHOST=$TEST_DIR/socket PGPORT=$TEST_PORT PGUSER=postgres

installcheck() { # installcheck regress|isolation
    local status
    if [ "$1" = regress ]; then
        make -C tests installcheck PG_CONFIG="$PG_CONFIG" ISOLATION=
    else
        make -C tests installcheck PG_CONFIG="$PG_CONFIG" REGRESS=
    fi
    status=$?
    [ $status -ne 0 ] && find "tests/results/$1" -name '*.diffs' -exec cat {} + | head -200
    return $status
}
rm -rf tests/results
run regress installcheck regress
run isolation installcheck isolation
run pg_cron tests/pg_cron/run.sh
run upgrade tests/upgrade/run.sh

completer() {
    psql -X -q -c "DROP DATABASE IF EXISTS completer_test" -c "CREATE DATABASE completer_test" postgres &&
        /usr/bin/python3 examples/completer.py --self-test --host "$PGHOST" --port "$PGPORT" --dbname completer_test
}
run completer completer

# The stress run crashes its server once, so it gets a cluster of its own.
stress() {
    local dir=/tmp/idempotency-stress port=54332 status
    scripts/cluster.sh stop "$dir"
    rm -rf "$dir"
    scripts/cluster.sh start "$dir" "$port" || return 1
    /usr/bin/python3 tests/stress/stress.py --host "$dir/socket" --port "$port" --datadir "$dir/data" \
        --seconds "${STRESS_SECONDS:-20}" --sessions 32 --keys 300
    status=$?
    scripts/cluster.sh stop "$dir"
    return $status
}
run stress stress

# Privileges, row-level security, search_path hijacks, dump/restore, a hot standby, huge input.
run security tests/security/run.sh

# The example HTTP service under real faults, and the client examples in other languages.
run e2e tests/e2e/run.sh
run client-examples tests/clients/run_examples.sh

# The benchmark scripts, smoke-tested so they keep working (figures of a smoke run mean nothing).
bench_smoke() { bench/run.sh --smoke && echo "bench-smoke: 1 passed, 0 failed"; }
run bench-smoke bench_smoke

# Citus: coordinator and two workers; skipped with a message where Citus is not installed.
run citus tests/citus/run.sh

echo
if [ ${#broken[@]} -gt 0 ]; then
    printf 'failed suite: %s\n' "${broken[@]}"
fi
echo "total: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
