#!/usr/bin/env bash
# Security suite of the idempotency extension, against the installed extension:
#   privileges   the model (SECURITY INVOKER, EXECUTE for PUBLIC, table grants decide) and
#                the GRANT recipe of docs/security.md; a pg_cron schema squatter
#   rls          the row-level-security recipe binding a tenant role to its own scopes
#   search_path  hostile look-alike functions, operators, aggregates, views in a schema
#                placed first on search_path, and in pg_temp
#   dump         pg_dump -Fc / pg_restore (and plain format) of live records
#   standby      a streaming hot standby: lookups work, writes answer 25006
#   limits       hostile and huge input, each with the same backend before and after
#
#   tests/security/run.sh            every section
#   tests/security/run.sh rls dump   some of them (privileges rls search_path dump standby limits)
#   IDEM_EDITION=portable tests/security/run.sh   against the portable edition (tests/lib.sh):
#                                    where it differs, the check asserts the portable behaviour,
#                                    each with a comment "portable:" (docs/portable.md lists them)
#
# Starts its own clusters of PG_MAJOR (15 or 18; ports: tests/lib.sh's "security" row, data
# under $SEC_DIR, default /tmp/idempotency-security[-pg18]), removes them afterwards (SEC_KEEP=1 keeps them), prints one
# line per check and ends with "security: N passed, M failed"; exits 1 on any failure.
# The whole run is bounded by SEC_TIMEOUT seconds (default 1200), each psql by 300 s.
set -uo pipefail
# check, ok, fail, skip, finish, as_postgres, cluster_start/stop, port_of; PGBIN (first on PATH,
# so pg_dump, pg_restore and pg_basebackup are PG_MAJOR's own).
. "$(dirname "$0")/../lib.sh" || exit 2
cd "$ROOT" || exit 2
HERE=$ROOT/tests/security
SEC_DIR=${SEC_DIR:-$(dir_of security)}
MAIN=$SEC_DIR/main
MAIN_PORT=$(port_of security)
PRIMARY=$SEC_DIR/primary
# shellcheck disable=SC2034 # used by checks/standby.sh, sourced below
PRIMARY_PORT=$((MAIN_PORT + 1))
STANDBY=$SEC_DIR/standby
# shellcheck disable=SC2034 # used by checks/standby.sh, sourced below
STANDBY_PORT=$((MAIN_PORT + 2))
LOG=$SEC_DIR/psql-errors.log
PSQL_TIMEOUT=300
BACKGROUND=()

section() { echo; echo "== $1"; }

# --- clusters and SQL --------------------------------------------------------------------

# psql_at DIR PORT ROLE DB [psql args...]: tuples only, unaligned, errors to stderr.
psql_at() {
    local dir=$1 port=$2 role=$3 db=$4
    shift 4
    PGAPPNAME=${APP:-security} timeout "$PSQL_TIMEOUT" \
        psql -X -q -At -h "$dir/socket" -p "$port" -U "$role" -d "$db" "$@"
}

# On the main cluster: sql ROLE DB [psql args] (stdin or -c), stderr to the log.
sql() {
    local role=$1 db=$2
    shift 2
    psql_at "$MAIN" "$MAIN_PORT" "$role" "$db" "$@" 2>>"$LOG"
}

# val ROLE DB SQL: the output of SQL.
val() { sql "$1" "$2" -c "$3"; }

# state ROLE DB SQL: the SQLSTATE of the last statement of SQL (00000 when it succeeded).
state() {
    printf '\\o /dev/null\n%s\n\\o\n\\echo :SQLSTATE\n' "$3" | sql "$1" "$2" | tail -n 1
}

# state_msg ROLE DB SQL: "SQLSTATE message" of the last statement.
state_msg() {
    printf '\\o /dev/null\n%s\n\\o\n\\echo :SQLSTATE :LAST_ERROR_MESSAGE\n' "$3" | sql "$1" "$2" | tail -n 1
}

# field NAME TEXT: the value of the first line "NAME=value" of TEXT.
# The read paths a statement's calls took (docs/operations.md#read-paths), from their DEBUG1
# lines, ';'-separated, with idempotency.direct_read on (whatever PGOPTIONS says).
read_paths() { # read_paths ROLE DB SQL
    printf 'SET idempotency.direct_read = on;\nSET client_min_messages = debug1;\n%s\n' "$3" |
        psql_at "$MAIN" "$MAIN_PORT" "$1" "$2" 2>&1 >/dev/null | sed -n 's/^DEBUG:  idempotency\.//p' | paste -sd ';'
}

field() { printf '%s\n' "$2" | sed -n "s/^$1=//p" | head -n 1; }

# Server log lines that would mean a backend died or Rust code failed.
crash_lines() { # crash_lines LOGFILE
    grep -E "terminated by signal|was terminated by|PANIC|server process .* exited with exit code [^0]| XX000 " "$1" 2>/dev/null | grep -vc "^$" || true
}

# start_cluster DIR PORT [conf lines...]: initdb (first time) and start, logging what the
# crash check below reads.
start_cluster() {
    local dir=$1 port=$2
    shift 2
    cluster_start "$dir" "$port" "log_line_prefix = '%m [%p] %e app=%a '" "log_min_messages = warning" "$@"
}

stop_all() {
    local pid
    for pid in "${BACKGROUND[@]}"; do kill "$pid" 2>/dev/null; done
    for dir in "$STANDBY" "$PRIMARY" "$MAIN"; do
        [ -d "$dir" ] && cluster_stop "$dir"
    done
}

cleanup() {
    stop_all
    [ -n "${WATCHDOG:-}" ] && kill "$WATCHDOG" 2>/dev/null
    if [ "${SEC_KEEP:-0}" != 1 ] && [ "$failed" -eq 0 ]; then
        rm -rf "$SEC_DIR"
    else
        echo "(clusters stopped; their data and logs are kept in $SEC_DIR)"
    fi
}

# --- the run ----------------------------------------------------------------------------

SECTIONS=("$@")
[ ${#SECTIONS[@]} -eq 0 ] && SECTIONS=(privileges rls search_path dump standby limits)
wanted() { local s; for s in "${SECTIONS[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

# Leftovers of an interrupted run.
stop_all
rm -rf "$SEC_DIR"
mkdir -p "$SEC_DIR"
chmod 755 "$SEC_DIR"
: >"$LOG"

trap 'cleanup' EXIT
trap 'fail "the run" "interrupted or out of time (SEC_TIMEOUT=${SEC_TIMEOUT:-1200} s)"; finish security; exit 1' INT TERM
# The watchdog: TERM to this script after SEC_TIMEOUT seconds. Its sleep is its own child,
# killed with it, and it holds none of our output open.
(
    trap 'kill $sleeper 2>/dev/null; exit 0' TERM
    sleep "${SEC_TIMEOUT:-1200}" & sleeper=$!
    wait $sleeper && kill -TERM $$
) >/dev/null 2>&1 &
WATCHDOG=$!

echo "PostgreSQL $PG_MAJOR: $PGBIN, edition $IDEM_EDITION"
if [ "$IDEM_EDITION" = native ] && ! extension_installed; then
    fail "the extension is installed into PostgreSQL $PG_MAJOR" "cargo pgrx install --release --pg-config $PGBIN/pg_config"
    finish security
    exit 1
fi

# The editions differ in a few checks: by_edition NATIVE PORTABLE prints the expected value
# of the edition under test.
PORTABLE=0
[ "$IDEM_EDITION" = portable ] && PORTABLE=1
by_edition() { if [ "$PORTABLE" = 1 ]; then printf '%s' "$2"; else printf '%s' "$1"; fi; }

HAVE_CRON=0
[ -f "$("$PGBIN/pg_config" --pkglibdir)/pg_cron.so" ] && HAVE_CRON=1
cron_conf=()
[ $HAVE_CRON = 1 ] && cron_conf=("shared_preload_libraries = 'pg_cron'" "cron.database_name = 'postgres'")
if ! start_cluster "$MAIN" "$MAIN_PORT" "${cron_conf[@]}" >"$SEC_DIR/start-main.log" 2>&1; then
    cat "$SEC_DIR/start-main.log" "$MAIN/server.log" 2>/dev/null
    fail "start the main cluster"
    finish security
    exit 1
fi

# Roles used across sections (cluster-wide).
sql postgres postgres <<'SQL'
CREATE ROLE sec_nogrants LOGIN;
CREATE ROLE sec_usage LOGIN;
CREATE ROLE sec_reader LOGIN;
CREATE ROLE sec_app LOGIN;
CREATE ROLE sec_evil LOGIN;
CREATE ROLE sec_dbowner LOGIN;
CREATE ROLE sec_maint LOGIN BYPASSRLS;
CREATE ROLE idem_tenant NOLOGIN;
CREATE ROLE tenant_a LOGIN IN ROLE idem_tenant;
CREATE ROLE tenant_b LOGIN IN ROLE idem_tenant;
SQL

# newdb NAME [OWNER]: a fresh database with the extension.
newdb() {
    sql postgres postgres -c "DROP DATABASE IF EXISTS $1" -c "CREATE DATABASE $1 OWNER ${2:-postgres}"
    install_extension "$1" -h "$MAIN/socket" -p "$MAIN_PORT" -U postgres 2>>"$LOG"
}

for s in privileges rls search_path dump standby limits; do
    if wanted "$s"; then
        # shellcheck source=/dev/null
        source "$HERE/checks/$s.sh"
    fi
done

section "server logs"
check "main cluster: no backend crash, PANIC or internal (XX000) error in the server log" 0 "$(crash_lines "$MAIN/server.log")"

echo
grep -h "failed (try" "$SEC_DIR"/start-*.log 2>/dev/null | sed 's/^/note: a cluster start was retried: /'
if [ "$failed" -gt 0 ] && [ -s "$LOG" ]; then
    echo "(psql errors of the run, last 30 lines, from $LOG)"
    tail -n 30 "$LOG"
fi
finish security
