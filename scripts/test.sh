#!/usr/bin/env bash
# Command 2 of the README: the whole test suite, on a fresh Debian 12 machine as root.
#   1. Rust unit tests of the pure modules and in-process #[pg_test]s (cargo pgrx test)
#   2. the extension built and installed, a throwaway cluster started
#   3. the pg_regress suite and the isolationtester specs against it (make -C tests installcheck)
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

# Adds a suite's counts from its log: cargo's "test result:" lines, pg_regress's summary.
count() {
    local name=$1 log=$2 status=$3 p f
    p=$(grep -oE 'test result: [a-zA-Z]+\. [0-9]+ passed' "$log" | awk '{s+=$4} END {print s+0}')
    f=$(grep -oE '; [0-9]+ failed' "$log" | awk '{s+=$2} END {print s+0}')
    if grep -qE 'All [0-9]+ tests passed|[0-9]+ of [0-9]+ tests failed' "$log"; then
        local all ok_n fail_n
        all=$(grep -oE 'All [0-9]+ tests passed' "$log" | awk '{s+=$2} END {print s+0}')
        fail_n=$(grep -oE '[0-9]+ of [0-9]+ tests failed' "$log" | awk '{f+=$1; t+=$3} END {print f+0, t+0}')
        ok_n=$(( all + ${fail_n#* } - ${fail_n% *} ))
        p=$(( p + ok_n ))
        f=$(( f + ${fail_n% *} ))
    fi
    if [ "$status" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    passed=$(( passed + p ))
    failed=$(( failed + f ))
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

regress() {
    rm -rf tests/results
    make -C tests installcheck PG_CONFIG="$PG_CONFIG"
    local status=$?
    if [ $status -ne 0 ]; then
        find tests/results -name '*.diffs' -exec cat {} + | head -200
    fi
    return $status
}
run regress-and-isolation regress

echo
if [ ${#broken[@]} -gt 0 ]; then
    printf 'failed suite: %s\n' "${broken[@]}"
fi
echo "total: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
