#!/usr/bin/env bash
# The extension on Citus: a coordinator and two workers on 127.0.0.1, started here, the
# extension created on each, idempotency.distribute() called on the coordinator, then the
# checks of tests/citus/check.py through the coordinator. Skipped, with a message, where
# Citus is not installed (Citus is not a Debian package: see docs/operations.md, "Scaling out
# with Citus", for building it). The last line is "citus: N passed, M failed".
#   tests/citus/run.sh [DIR] [PORT]      coordinator on PORT, workers on PORT+1 and PORT+2
# CITUS_TEST_SETUP_SQL=FILE runs FILE on every node right after CREATE EXTENSION (to try a
# change to the extension's SQL before it is built).
set -uo pipefail
. "$(dirname "$0")/../lib.sh" || exit 2
cd "$ROOT" || exit 2
DIR=${1:-$(dir_of citus)}
PORT=${2:-$(port_of citus)}

end_suite() { finish citus; exit; }

control="$("$PGBIN/pg_config" --sharedir)/extension/citus.control"
if [ ! -f "$control" ]; then
    echo "citus: skipped on PostgreSQL $PG_MAJOR: Citus is not installed here ($control not found)."
    echo "       Citus is not a Debian package: build it from source into this PostgreSQL to run these checks (docs: Scaling out with Citus)."
    end_suite
fi

NODES=(coordinator worker1 worker2)
stop_all() { for n in "${NODES[@]}"; do cluster_stop "$DIR/$n"; done; }
stop_all
rm -rf "$DIR"
for i in 0 1 2; do
    if ! cluster_start "$DIR/${NODES[$i]}" $((PORT + i)) "$LISTEN_TCP" "shared_preload_libraries = 'citus'"; then
        fail "starting ${NODES[$i]}" "see $DIR/${NODES[$i]}/server.log"
        stop_all
        end_suite
    fi
done
trap stop_all EXIT

conninfo() { echo "host=$DIR/${NODES[$1]}/socket port=$((PORT + $1)) user=postgres dbname=${2:-postgres}"; }
q() { # q NODE_INDEX [psql args]: quiet, unaligned, stop on error
    local i=$1; shift
    psql -X -q -At -v ON_ERROR_STOP=1 "$(conninfo "$i")" "$@"
}
sqlstate() { # sqlstate NODE_INDEX DB SQL: the SQLSTATE of the error SQL raises, or "none"
    local out
    out=$(psql -X -q -At -v VERBOSITY=verbose "$(conninfo "$1" "$2")" -c "$3" 2>&1)
    [[ $out =~ ERROR:\ +([0-9A-Z]{5}): ]] && echo "${BASH_REMATCH[1]}" || echo none
}

setup_ok=true
for i in 0 1 2; do
    { q "$i" -c "CREATE EXTENSION citus" && install_extension postgres -h "$DIR/${NODES[$i]}/socket" -p $((PORT + i)) -U postgres; } || setup_ok=false
    if [ -n "${CITUS_TEST_SETUP_SQL:-}" ]; then
        q "$i" -f "$CITUS_TEST_SETUP_SQL" || setup_ok=false
    fi
done
q 0 -c "SELECT citus_set_coordinator_host('127.0.0.1', $PORT)" \
    -c "SELECT citus_add_node('127.0.0.1', $((PORT + 1)))" \
    -c "SELECT citus_add_node('127.0.0.1', $((PORT + 2)))" >/dev/null || setup_ok=false
check "coordinator and two workers up, extension on each" true "$setup_ok"
$setup_ok || end_suite

# A build made before sql/citus.sql was part of the install script has no distribute():
# create it from the repository so that the rest can run.
if [ "$(q 0 -c "SELECT to_regprocedure('idempotency.distribute(boolean)') IS NULL")" = t ]; then
    echo "note: the installed extension has no idempotency.distribute(); created from sql/citus.sql"
    q 0 -f "$ROOT/sql/citus.sql" || true
fi

first=$(q 0 -c "SELECT string_agg(object || ': ' || action, E'\n' ORDER BY object) FROM idempotency.distribute()" 2>&1)
# shellcheck disable=SC2001 # indents every line
echo "$first" | sed 's/^/     /'
check "distribute() distributes keys and messages by scope" \
    "idempotency.keys: distributed by scope|idempotency.messages: distributed by scope" \
    "$(echo "$first" | grep -E '^idempotency\.(keys|messages):' | paste -sd'|')"
second=$(q 0 -c "SELECT count(*) FILTER (WHERE action LIKE 'already%' OR action LIKE 'not delegated%') || '/' || count(*)
                 FROM idempotency.distribute()" 2>&1)
# 9 rows: the two tables and the seven scope-first functions (idem_seen_many since 0.4.0).
check "distribute() again changes nothing (idempotent)" "9/9" "$second"
check "distribute() on a worker: 55000" 55000 "$(sqlstate 1 postgres "SELECT idempotency.distribute()")"
psql -X -q "$(conninfo 0)" -c "CREATE DATABASE plain" 2>/dev/null
psql -X -q "$(conninfo 0 plain)" -c "CREATE EXTENSION idempotency"
psql -X -q -At "$(conninfo 0 plain)" -c "SELECT to_regprocedure('idempotency.distribute(boolean)') IS NULL" | grep -q t &&
    psql -X -q "$(conninfo 0 plain)" -f "$ROOT/sql/citus.sql" >/dev/null
check "distribute() where Citus is not installed: 55000" 55000 "$(sqlstate 0 plain "SELECT idempotency.distribute()")"
hint=$(psql -X -q -At "$(conninfo 0 plain)" -c "SELECT idempotency.distribute()" 2>&1 | grep -c "HINT:  On every node: shared_preload_libraries = 'citus'")
check "... with a hint on what to do" 1 "$hint"

/usr/bin/python3 "$ROOT/tests/citus/check.py" --coordinator "$(conninfo 0)" \
    --worker "$(conninfo 1)" --worker "$(conninfo 2)" | tee "$DIR/check.log"
summary=$(grep -E '^summary passed=[0-9]+ failed=[0-9]+$' "$DIR/check.log" | tail -1)
if [[ $summary =~ passed=([0-9]+)\ failed=([0-9]+) ]]; then
    passed=$((passed + BASH_REMATCH[1])); failed=$((failed + BASH_REMATCH[2]))
else
    fail "check.py did not finish"
fi
end_suite
