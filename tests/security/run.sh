#!/usr/bin/env bash
# Security suite of the idempotency extension, against the installed extension:
#   privileges   the model (SECURITY INVOKER, EXECUTE for PUBLIC, table grants decide) and
#                the README's GRANT recipe; a pg_cron schema squatter
#   rls          the row-level-security recipe binding a tenant role to its own scopes
#   search_path  hostile look-alike functions, operators, aggregates, views in a schema
#                placed first on search_path, and in pg_temp
#   dump         pg_dump -Fc / pg_restore (and plain format) of live records
#   standby      a streaming hot standby: lookups work, writes answer 25006
#   limits       hostile and huge input, each with the same backend before and after
#
#   tests/security/run.sh            every section
#   tests/security/run.sh rls dump   some of them (privileges rls search_path dump standby limits)
#
# Starts its own clusters (ports 55450-55452, data under $SEC_DIR, default
# /tmp/idempotency-security), removes them afterwards (SEC_KEEP=1 keeps them), prints one
# line per check and ends with "security: N passed, M failed"; exits 1 on any failure.
# The whole run is bounded by SEC_TIMEOUT seconds (default 1200), each psql by 300 s.
set -uo pipefail
unset RUST_BACKTRACE RUST_LIB_BACKTRACE
cd "$(dirname "$0")/../.."
ROOT=$PWD
HERE=$ROOT/tests/security
SEC_DIR=${SEC_DIR:-/tmp/idempotency-security}
MAIN=$SEC_DIR/main
MAIN_PORT=55450
PRIMARY=$SEC_DIR/primary
PRIMARY_PORT=55451
STANDBY=$SEC_DIR/standby
STANDBY_PORT=55452
PGBIN=/usr/lib/postgresql/15/bin
export PATH="$PGBIN:$PATH"
LOG=$SEC_DIR/psql-errors.log
PSQL_TIMEOUT=300
passed=0
failed=0
skipped=0
BACKGROUND=()

# --- reporting ---------------------------------------------------------------------------

ok() { passed=$((passed + 1)); echo "ok   $1"; }
fail() { failed=$((failed + 1)); echo "FAIL $1${2:+: $2}"; }
skip() { skipped=$((skipped + 1)); echo "skip $1${2:+: $2}"; }

# check NAME EXPECTED ACTUAL
check() {
    if [ "$2" = "$3" ]; then ok "$1"; else fail "$1" "expected '$2', got '$3'"; fi
}

# check_match NAME EXTENDED-REGEX ACTUAL
check_match() {
    if [[ $3 =~ $2 ]]; then ok "$1"; else fail "$1" "expected /$2/, got '$3'"; fi
}

section() { echo; echo "== $1"; }

# --- clusters and SQL --------------------------------------------------------------------

# From /, which the postgres user can enter: the work tree may be a root-only folder, and
# PostgreSQL's tools warn when they cannot change to their working directory.
as_postgres() { if [ "$(id -u)" = 0 ]; then (cd / && runuser -u postgres -- "$@"); else "$@"; fi; }

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
field() { printf '%s\n' "$2" | sed -n "s/^$1=//p" | head -n 1; }

# Server log lines that would mean a backend died or Rust code failed.
crash_lines() { # crash_lines LOGFILE
    grep -E "terminated by signal|was terminated by|PANIC|server process .* exited with exit code [^0]| XX000 " "$1" 2>/dev/null | grep -vc "^$" || true
}

# start_cluster DIR PORT [conf lines...]: initdb (first time) and start. Our ports lie in
# Linux's ephemeral range, so a client connection elsewhere on the machine can hold one for
# a moment ("could not bind"): up to three tries, two seconds apart.
start_cluster() {
    local dir=$1 port=$2 try
    shift 2
    for try in 1 2 3; do
        "$ROOT/scripts/cluster.sh" start "$dir" "$port" \
            "log_line_prefix = '%m [%p] %e app=%a '" "log_min_messages = warning" "$@" && return 0
        echo "start of $dir failed (try $try); its log says:"
        tail -n 5 "$dir/server.log" 2>/dev/null
        sleep 2
    done
    return 1
}

stop_all() {
    local pid
    for pid in "${BACKGROUND[@]}"; do kill "$pid" 2>/dev/null; done
    for dir in "$STANDBY" "$PRIMARY" "$MAIN"; do
        [ -d "$dir" ] && "$ROOT/scripts/cluster.sh" stop "$dir" >/dev/null 2>&1
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
trap 'fail "the run" "interrupted or out of time (SEC_TIMEOUT=${SEC_TIMEOUT:-1200} s)"; echo "security: $passed passed, $failed failed"; exit 1' INT TERM
# The watchdog: TERM to this script after SEC_TIMEOUT seconds. Its sleep is its own child,
# killed with it, and it holds none of our output open.
(
    trap 'kill $sleeper 2>/dev/null; exit 0' TERM
    sleep "${SEC_TIMEOUT:-1200}" & sleeper=$!
    wait $sleeper && kill -TERM $$
) >/dev/null 2>&1 &
WATCHDOG=$!

if [ ! -f /usr/share/postgresql/15/extension/idempotency.control ]; then
    echo "the extension is not installed: cargo pgrx install --release --pg-config $PGBIN/pg_config"
    echo "security: 0 passed, 1 failed"
    exit 1
fi

HAVE_CRON=0
[ -f "$($PGBIN/pg_config --pkglibdir)/pg_cron.so" ] && HAVE_CRON=1
cron_conf=()
[ $HAVE_CRON = 1 ] && cron_conf=("shared_preload_libraries = 'pg_cron'" "cron.database_name = 'postgres'")
if ! start_cluster "$MAIN" "$MAIN_PORT" "${cron_conf[@]}" >"$SEC_DIR/start-main.log" 2>&1; then
    cat "$SEC_DIR/start-main.log" "$MAIN/server.log" 2>/dev/null
    echo "security: 0 passed, 1 failed"
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
    sql postgres "$1" -c "CREATE EXTENSION idempotency"
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
[ "$skipped" -gt 0 ] && echo "($skipped checks skipped)"
echo "security: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
