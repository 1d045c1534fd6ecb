#!/usr/bin/env bash
# The parity check (issue 21): a fresh native install and a fresh portable install of the
# current version, each described by tests/upgrade/describe.sql, compared with each other and
# with the contract's description, contract/contract.json (functions with their arguments,
# defaults, result, volatility, strictness and parallel safety; the tables', views' and
# types' columns in order). What truly differs between the editions is on the commented
# allow-list tests/parity/allowed.txt; an entry nothing needs any more fails too.
# Needs the native extension installed into PG_MAJOR (cargo pgrx install).
# Last line: "parity: N passed, M failed".
#   tests/parity/run.sh
set -uo pipefail
. "$(dirname "$0")/../lib.sh" || exit 2
cd "$ROOT" || exit 2
DIR=$(dir_of parity)
PORT=$(port_of parity)

# The comparison's own unit tests first (its reading of describe.sql's lines).
if selftest=$(/usr/bin/python3 tests/parity/compare.py --self-test 2>&1); then
    ok "compare.py --self-test ($(tail -n 1 <<<"$selftest"))"
else
    fail "compare.py --self-test" "$selftest"
fi

if ! extension_installed; then
    fail "the native extension is installed into PostgreSQL $PG_MAJOR"
    finish parity
    exit
fi
cluster_fresh "$DIR" "$PORT" || { fail "start the cluster"; finish parity; exit; }
trap 'cluster_stop "$DIR"' EXIT
q() { psql -X -q -At -v ON_ERROR_STOP=1 -h "$DIR/socket" -p "$PORT" -U postgres "$@"; }

q -d postgres -c "CREATE DATABASE native" -c "CREATE DATABASE portable"
q -d native -c "CREATE EXTENSION idempotency VERSION '$(extension_version)'"
q -d portable -1 -f "$(portable_script)" >/dev/null
q -d native -f tests/upgrade/describe.sql >"$DIR/native.txt"
q -d portable -f tests/upgrade/describe.sql >"$DIR/portable.txt"
check "both installs described ($(grep -c '^signature' "$DIR/native.txt") native and $(grep -c '^signature' "$DIR/portable.txt") portable functions)" \
    "yes" "$([ -s "$DIR/native.txt" ] && [ -s "$DIR/portable.txt" ] && echo yes || echo no)"

/usr/bin/python3 tests/parity/compare.py --native "$DIR/native.txt" --portable "$DIR/portable.txt" \
    --contract contract/contract.json --allowed tests/parity/allowed.txt >"$DIR/compare.txt" 2>&1
status=$?
before=$failed
while IFS= read -r line; do
    case $line in
    "ok   "*) ok "${line#ok   }" ;;
    "FAIL "*) fail "${line#FAIL }" ;;
    "skip "*) rest=${line#skip }; skip "${rest%%: *}" "${rest#*: }" ;;
    *) echo "$line" ;;
    esac
done <"$DIR/compare.txt"
# A comparison that stopped (an exception, a bad allow-list) is a failure of its own.
[ "$status" -ne 0 ] && [ "$failed" -eq "$before" ] && fail "compare.py ended with status $status"

finish parity
