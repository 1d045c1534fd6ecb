# Sourced by run.sh. Hostile look-alikes (sql/evil.sql: functions now, unnest, array_agg,
# count, gen_random_uuid, ...; operators = <> < <= > >= + || ~~ on text, uuid, timestamptz,
# int, bigint, interval, jsonb; views keys, messages, claim_result, stats; a squatted cron
# schema) in a schema `evil` owned by an unprivileged role, placed first on search_path,
# and in pg_temp. sql/scenario.sql runs every API function through every outcome; its
# output (and its error messages) must be the same as without the hostile objects, and
# no hostile object may ever run.

section "search_path: hostile objects first on search_path"
SP=$SEC_DIR/search_path
mkdir -p "$SP"
HOSTILE="evil, pg_catalog, public"

prepare_sp_db() { # prepare_sp_db DB with-evil|clean
    newdb "$1"
    sql postgres "$1" -v role=sec_app -f "$HERE/sql/grants.sql"
    sql postgres "$1" -c "GRANT SELECT ON idempotency.stats TO sec_app" -c "GRANT CREATE ON DATABASE $1 TO sec_evil"
    if [ "$2" = with-evil ]; then
        sql sec_evil "$1" -v ON_ERROR_STOP=1 -f "$HERE/sql/evil.sql" >/dev/null ||
            fail "creating the hostile objects in $1"
    fi
}

# run_scenario NAME ROLE DB PRELUDE [POSTLUDE]: the scenario's stdout and stderr, with the
# database name replaced, in $SP/NAME.out.
run_scenario() {
    local name=$1 role=$2 db=$3 prelude=$4
    {
        printf '%s\n' "$prelude"
        echo "\\i $HERE/sql/scenario.sql"
    } | APP=sec-sp-$name psql_at "$MAIN" "$MAIN_PORT" "$role" "$db" -v scope=sp \
        >"$SP/$name.stdout" 2>"$SP/$name.stderr"
    # Only what follows the marker, when there is one (the warm-up before it is not compared).
    for f in stdout stderr; do
        if grep -q '^==== hostile' "$SP/$name.$f"; then
            sed -i '1,/^==== hostile/d' "$SP/$name.$f"
        fi
    done
    cat "$SP/$name.stdout" "$SP/$name.stderr" | sed "s/$db/DB/g" >"$SP/$name.out"
}

# The outputs, less the NOTICE a sweep by a role that does not own the tables gives (it
# leaves the partitions to the owner: docs/operations.md#partitions), which only the
# application role's runs have.
outputs() { grep -v "idem_sweep: only the owner of idempotency.keys makes and drops its partitions" "$SP/$1.out"; }

compare() { # compare NAME DESCRIPTION
    if [ ! -s "$SP/base.out" ] || [ ! -s "$SP/$1.out" ]; then
        fail "$2" "no output"
    elif diff -q <(outputs base) <(outputs "$1") >/dev/null; then
        ok "$2 ($(outputs base | wc -l) lines identical)"
    else
        fail "$2" "outputs differ:"
        diff <(outputs base) <(outputs "$1") | head -n 20
    fi
}

prepare_sp_db sec_sp_base clean
prepare_sp_db sec_sp_evil with-evil
prepare_sp_db sec_sp_evil_su with-evil
prepare_sp_db sec_sp_temp with-evil
prepare_sp_db sec_sp_replan with-evil

run_scenario base sec_app sec_sp_base ""
check "baseline scenario ran (claim, complete, replay, takeover, reclaim, sweep, seen, fingerprints, errors)" \
    "claim fresh|claimed|t||1|t|t" "$(head -n 1 "$SP/base.stdout")"

# The traps are armed: the same names, unqualified, do reach evil.* on these search_paths.
control() { # control DESCRIPTION SQL [PRELUDE]
    check "trap armed: $1 resolves to the hostile object (EV001)" EV001 \
        "$(APP=sec-control state sec_app sec_sp_evil "${3:-}SET search_path = $HOSTILE; $2")"
}
control "now()" "SELECT now();"
control "text = text" "SELECT 'a'::pg_catalog.text = 'a';"
control "uuid = uuid" "SELECT pg_catalog.gen_random_uuid() = pg_catalog.gen_random_uuid();"
control "timestamptz <= timestamptz" "SELECT pg_catalog.now() <= pg_catalog.now();"
control "timestamptz + interval" "SELECT pg_catalog.now() + interval '1 minute';"
control "int + int" "SELECT 1 + 1;"
control "count(*)" "SELECT count(*) FROM pg_catalog.pg_class;"
control "array_agg(text)" "SELECT array_agg(relname::pg_catalog.text) FROM pg_catalog.pg_class;"
control "unnest(anyarray)" "SELECT unnest(ARRAY[1]);"
control "gen_random_uuid()" "SELECT gen_random_uuid();"
control "an unqualified table name keys" "SELECT * FROM keys;"
control "the squatted cron.schedule" "SELECT cron.schedule('a', 'b', 'c');"

run_scenario evil sec_app sec_sp_evil "SET search_path = $HOSTILE;"
compare evil "search_path = evil, pg_catalog, public (application role): every outcome, result and error is the same"

run_scenario evil_su postgres sec_sp_evil_su "SET search_path = $HOSTILE;"
compare evil_su "search_path = evil, pg_catalog, public (superuser): every outcome, result and error is the same"

TEMP_OBJECTS="
CREATE TEMP VIEW keys AS SELECT relname FROM pg_catalog.pg_class WHERE evil.trap_bool('read of temp view keys');
CREATE TEMP VIEW messages AS SELECT relname FROM pg_catalog.pg_class WHERE evil.trap_bool('read of temp view messages');
CREATE TEMP TABLE claim_result (outcome text, token uuid);
INSERT INTO pg_temp.claim_result VALUES ('replay', NULL);
CREATE TEMP VIEW stats AS SELECT relname FROM pg_catalog.pg_class WHERE evil.trap_bool('read of temp view stats');
SET search_path = pg_temp, $HOSTILE;"
check "trap armed: an unqualified keys resolves to the temp view first (EV001)" EV001 \
    "$(APP=sec-control state sec_app sec_sp_temp "$TEMP_OBJECTS SELECT * FROM keys;")"
run_scenario temp sec_app sec_sp_temp "$TEMP_OBJECTS"
compare temp "search_path = pg_temp, evil, pg_catalog, public with temp keys/messages/claim_result/stats: the same"

# Plans are prepared once per backend: prepared under a clean search_path, then used
# under the hostile one (PostgreSQL re-plans on a search_path change).
REPLAN="\\set scope warm
\\i $HERE/sql/scenario.sql
\\o /dev/null
DELETE FROM idempotency.keys WHERE scope OPERATOR(pg_catalog.=) 'warm';
DELETE FROM idempotency.messages WHERE scope OPERATOR(pg_catalog.=) 'warm';
\\o
\\echo ==== hostile
\\warn ==== hostile
SET search_path = $HOSTILE;
\\set scope sp"
run_scenario replan sec_app sec_sp_replan "$REPLAN"
compare replan "plans prepared under a clean search_path, then used under the hostile one: the same"

check "no hostile function, operator, aggregate, view or trigger ran during the scenarios" 0 \
    "$(grep -c "EVIL-CALLED.*app=sec-sp-" "$MAIN/server.log")"
check "the controls did reach the traps (the log shows them)" yes \
    "$(grep -q "EVIL-CALLED.*app=sec-control" "$MAIN/server.log" && echo yes)"
