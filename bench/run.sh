#!/usr/bin/env bash
# The extension against the alternatives, on one throwaway cluster, in one command:
#   ext    the extension
#   peer   the same contract in hand-written PL/pgSQL (bench/plpgsql_peer.sql)
#   floor  the raw SQL of the usual article: INSERT ... ON CONFLICT (key) DO NOTHING
#          RETURNING id, then an UPDATE (it does less than the other two)
#   portable  the portable edition (sql/portable/, plain SQL and PL/pgSQL, docs/portable.md),
#          installed into a second database (bench_portable, same schema name as the
#          extension) and run with the ext scripts
#   ext_spi  the ext scripts in sessions started with PGOPTIONS='-c idempotency.direct_read=off':
#          the extension on its SPI read path (in the scenarios whose first look-up has the
#          direct read path: claim_complete replay in_progress mismatch seen_new seen_dup). On a
#          build without that setting it is only a placeholder and ext_spi runs what ext runs
#          (machine.txt says which). For a whole run on one path instead, --conf
#          'idempotency.direct_read = off' (a postgresql.conf line)
#   limit  what the writeless answers cannot beat: the bare prepared primary-key SELECT of the
#          stored record from idempotency.keys (replay, in_progress, mismatch), the bare
#          SELECT 1 from idempotency.messages (seen_dup); summary.md shows ext / limit
# in the scenarios of bench/scripts/<scenario>.<impl>.sql, with pgbench -n -M prepared -l.
# For each client count and scenario the implementations alternate, ext ext_spi peer floor portable
# limit ext ext_spi ..., for --rounds rounds, so that drift of a busy machine falls on all of them alike.
# With --pg "15 18" there is one cluster per major and, within each round, the majors
# alternate too (ext peer floor on 15, then on 18); summary.md adds an 18-against-15 table.
#
#   bench/run.sh [--pg "15 18"] [--seconds S] [--clients "2 16"] [--rounds R] [--scenarios "a b"]
#                [--impls "ext limit"] [--nkeys N] [--port P] [--dir DIR] [--out DIR]
#                [--conf 'name = value']... [--keep] [--smoke]
#
#   --pg MAJORS      the PostgreSQL majors, one or several (default: $PG_MAJOR, else 15); the
#                    extension must be installed into each. Ports: tests/lib.sh's "bench" row
#   --seconds S      pgbench -T per run (default 10)
#   --clients LIST   client counts (default "2 16"); pgbench threads: 2 at most (2 cores)
#   --rounds R       rounds of alternation (default 2, at least 2 for figures)
#   --impls LIST     the implementations to run where a scenario has them (default: all of
#                    ext ext_spi peer floor portable limit)
#   --nkeys N        pre-populated records per implementation for replay / in_progress /
#                    mismatch / duplicate messages (default 100000)
#   --scenarios      seen_many is not a pgbench script of its own: it runs bench/seen_many.sh
#                    (batches of 100 against 100 idem_seen calls and against its floor) on
#                    each major's cluster after the others, with --seconds, --rounds and 2
#                    clients, and appends its table to summary.md
#   --conf LINE      an extra postgresql.conf line, e.g. --conf 'fsync = on' (repeatable)
#   --smoke          what CI runs: 200 transactions per client instead of seconds, 2 clients,
#                    2 rounds, 1000 pre-populated keys; checks the scripts, not the speed
#   --keep           leave the cluster(s) running afterwards (else stopped and removed)
#   --port / --dir   one major only
#
# Writes DIR/results (default bench/results/run-<UTC time>): runs.tsv, the pgbench logs and
# outputs, machine.txt, checks.md (the no-xid / no-lock checks), summary.md / summary.tsv.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

SECONDS_PER_RUN=10
CLIENTS="2 16"
ROUNDS=2
NKEYS=100000
MAJORS=$PG_MAJOR
PORT=""
CDIR=""
OUT=""
KEEP=0
SMOKE=0
SCENARIOS="claim_complete replay in_progress mismatch seen_new seen_dup fp_1k fp_64k seen_many"
IMPLS="ext ext_spi peer floor portable limit"
# The scenarios whose first look-up (idem_claim's, idem_seen's) has a direct read path.
READ_PATH_SCENARIOS="claim_complete replay in_progress mismatch seen_new seen_dup"
CONF=("shared_buffers = 512MB" "max_wal_size = 4GB" "checkpoint_timeout = 30min")
while [ $# -gt 0 ]; do
    case $1 in
        --seconds) SECONDS_PER_RUN=$2; shift 2 ;;
        --clients) CLIENTS=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --scenarios) SCENARIOS=$2; shift 2 ;;
        --impls) IMPLS=$2; shift 2 ;;
        --nkeys) NKEYS=$2; shift 2 ;;
        --pg) MAJORS=$2; shift 2 ;;
        --port) PORT=$2; shift 2 ;;
        --dir) CDIR=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --conf) CONF+=("$2"); shift 2 ;;
        --keep) KEEP=1; shift ;;
        --smoke) SMOKE=1; shift ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
if [ "$SMOKE" = 1 ]; then
    CLIENTS="2"; ROUNDS=2; NKEYS=1000
fi
for i in $IMPLS; do
    case $i in ext|ext_spi|peer|floor|portable|limit) ;;
        *) echo "run.sh: --impls: unknown implementation '$i' (ext ext_spi peer floor portable limit)" >&2; exit 2 ;;
    esac
done
read -r -a MAJORS <<<"$MAJORS"
declare -A PORTS CDIRS
for m in "${MAJORS[@]}"; do
    use_major "$m" || { echo "run.sh: --pg: PostgreSQL '$m' is not available (majors: $PG_MAJORS)" >&2; exit 2; }
    extension_installed || { echo "run.sh: the extension is not installed into PostgreSQL $m" \
        "(cargo pgrx install --release --pg-config $PGBIN/pg_config --no-default-features --features pg$m)" >&2; exit 2; }
    PORTS[$m]=$(port_of bench "$m")
    CDIRS[$m]=/tmp/idempotency-bench-${PORTS[$m]}
done
if [ -n "$PORT$CDIR" ]; then
    [ ${#MAJORS[@]} -eq 1 ] || { echo "run.sh: --port / --dir need a single --pg major" >&2; exit 2; }
    PORTS[${MAJORS[0]}]=${PORT:-${PORTS[${MAJORS[0]}]}}
    CDIRS[${MAJORS[0]}]=${CDIR:-/tmp/idempotency-bench-${PORTS[${MAJORS[0]}]}}
fi
# on_major M: q, pgbench, machine_info and checks.sh talk to M's cluster.
on_major() { use_major "$1"; PORT=${PORTS[$1]}; CDIR=${CDIRS[$1]}; }
OUT=${OUT:-$BENCH/results/run-$(date -u +%Y%m%dT%H%M%SZ)$(if [ "$SMOKE" = 1 ]; then echo -smoke; fi)}
mkdir -p "$OUT/logs"
DB=bench
PORTABLE_DB=bench_portable
PORTABLE_SQL=$(printf '%s\n' "$ROOT"/sql/portable/idempotency-portable--*.sql | grep -v -- '--.*--' | sort -V | tail -n 1)

cleanup() {
    if [ "$KEEP" = 0 ]; then
        for m in "${MAJORS[@]}"; do
            cluster_stop "${CDIRS[$m]}"
            rm -rf "${CDIRS[$m]}"
        done
    fi
}
trap cleanup EXIT

: >"$OUT/machine.txt"
: >"$OUT/checks.md"
for m in "${MAJORS[@]}"; do
    on_major "$m"
    echo "== PostgreSQL $m: cluster $CDIR on port $PORT; results in $OUT"
    cluster_fresh "$CDIR" "$PORT" "${CONF[@]}"
    admin -c "CREATE DATABASE $DB"
    q -f "$BENCH/plpgsql_peer.sql" >/dev/null 2>&1
    echo "== populating ($NKEYS records per implementation and outcome)"
    q -v nkeys="$NKEYS" -f "$BENCH/setup.sql" >"$OUT/setup-pg$m.log"
    echo "== the portable edition ($(basename "$PORTABLE_SQL")) in database $PORTABLE_DB, populated alike"
    admin -c "CREATE DATABASE $PORTABLE_DB"
    DB=$PORTABLE_DB q -1 -f "$PORTABLE_SQL" >/dev/null
    DB=$PORTABLE_DB q -f "$BENCH/plpgsql_peer.sql" >/dev/null 2>&1
    sed '/^CREATE EXTENSION/d' "$BENCH/setup.sql" | DB=$PORTABLE_DB q -v nkeys="$NKEYS" >"$OUT/setup-portable-pg$m.log"
    [ ${#MAJORS[@]} -gt 1 ] && echo "## PostgreSQL $m" | tee -a "$OUT/machine.txt" "$OUT/checks.md"
    machine_info | tee -a "$OUT/machine.txt"
    # A session that has loaded the library lists the setting in pg_settings only if the
    # build defines it (a placeholder is not listed).
    if [ "$(q -c "SELECT idempotency.idem_lookup('-', '-') IS NULL" -c "SELECT count(*) FROM pg_settings WHERE name = 'idempotency.direct_read'" | tail -n 1)" = 1 ]; then
        echo "read paths:  idempotency.direct_read is a setting of this build: ext_spi runs the SPI read path" | tee -a "$OUT/machine.txt"
    else
        echo "read paths:  idempotency.direct_read is not a setting of this build: ext_spi runs what ext runs" | tee -a "$OUT/machine.txt"
    fi
    echo "== no transaction id, no lock for answers from a read"
    "$BENCH/checks.sh" "$CDIR" "$PORT" "$DB" | tee -a "$OUT/checks.md"
done

# script_of IMPL: the script suffix an implementation runs (portable and ext_spi run ext's).
script_of() { case $1 in portable|ext_spi) echo ext ;; *) echo "$1" ;; esac; }
impls_of() {
    local s=$1 i
    for i in $IMPLS; do
        [ "$i" = ext_spi ] && [[ " $READ_PATH_SCENARIOS " != *" $s "* ]] && continue
        [ -f "$BENCH/scripts/$s.$(script_of "$i").sql" ] && echo "$i"
    done
    return 0
}

printf 'clients\tscenario\timpl\tround\tlog_prefix\tpgbench_tps\txids\twal_bytes\tstarted\tpg\n' >"$OUT/runs.tsv"
for c in $CLIENTS; do
    threads=$(( c < 2 ? c : 2 ))
    for s in $SCENARIOS; do
        [ "$s" = seen_many ] && continue
        for r in $(seq 1 "$ROUNDS"); do
          for m in "${MAJORS[@]}"; do
            on_major "$m"
            for i in $(impls_of "$s"); do
                name=$s.$i.c$c.r$r
                [ ${#MAJORS[@]} -gt 1 ] && name=$name.pg$m
                q -c "CHECKPOINT"
                x0=$(xid_next); l0=$(wal_lsn); t0=$(date +%s)
                if [ "$SMOKE" = 1 ]; then length=(-t 200); else length=(-T "$SECONDS_PER_RUN"); fi
                # The portable edition: the ext script, in its own database; ext_spi: the ext
                # script with the direct read path off in every session.
                db=$DB; script=$(script_of "$i"); options=${PGOPTIONS:-}
                [ "$i" = portable ] && db=$PORTABLE_DB
                [ "$i" = ext_spi ] && options+=" -c idempotency.direct_read=off"
                PGOPTIONS=$options pgbench -h "$CDIR/socket" -p "$PORT" -U postgres -n -M prepared -c "$c" -j "$threads" \
                    "${length[@]}" -D nkeys="$NKEYS" -l --log-prefix="$OUT/logs/$name" \
                    -f "$BENCH/scripts/$s.$script.sql" "$db" >"$OUT/logs/$name.out" 2>&1 || {
                    echo "pgbench failed for $name:"; cat "$OUT/logs/$name.out"; exit 1; }
                x1=$(xid_next); l1=$(wal_lsn)
                tps=$(sed -n 's/^tps = \([0-9.]*\) (without.*/\1/p' "$OUT/logs/$name.out")
                printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$c" "$s" "$i" "$r" "logs/$name" "$tps" \
                    "$((x1 - x0))" "$(wal_diff "$l0" "$l1")" "$t0" "$m" >>"$OUT/runs.tsv"
                printf 'pg%s %-16s %-8s c=%-3s round %s: %10s tps\n' "$m" "$s" "$i" "$c" "$r" "$tps"
            done
          done
        done
    done
done

echo "== summary"
$PY "$BENCH/latency.py" summarize "$OUT"
if [[ " $SCENARIOS " == *" seen_many "* ]]; then
    for m in "${MAJORS[@]}"; do
        on_major "$m"
        echo "== idem_seen_many, PostgreSQL $m (bench/seen_many.sh)"
        many_args=(--seconds "$SECONDS_PER_RUN" --rounds "$ROUNDS")
        [ "$SMOKE" = 1 ] && many_args=(--seconds 1 --rounds 1 --ndup 1000)
        PGHOST=$CDIR/socket PGPORT=$PORT PGUSER=postgres OUT=$OUT/seen_many-pg$m \
            "$BENCH/seen_many.sh" "${many_args[@]}" >"$OUT/logs/seen_many-pg$m.out" 2>&1 || {
            echo "seen_many.sh failed:"; cat "$OUT/logs/seen_many-pg$m.out"; exit 1; }
        { echo; echo "## idem_seen_many, PostgreSQL $m"; echo; cat "$OUT/seen_many-pg$m/summary.md"; } |
            tee -a "$OUT/summary.md"
    done
fi
echo "results: $OUT"
