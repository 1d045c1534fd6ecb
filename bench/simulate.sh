#!/usr/bin/env bash
# Expiry over compressed days (issue 35): the DELETE sweep of 0.5.0 against the time partitions
# of 0.6.0, in one command, one design after the other, each in a database of its own on a
# cluster with the same settings (a fresh cluster for each when their builds differ):
#   delete      with --old VERSION (default 0.5.0): that release, built from the commit
#               sql/releases/past.tsv names into a copy of PostgreSQL 18 (bench/lib.sh's
#               copy_build), its one table swept by DELETE; with --old none: this build with
#               idempotency.partition_period = 0 (every completed record in the far partition,
#               swept by DELETE: the same design, the same claim path as partitions)
#   partitions  this build (with --old VERSION: in a copy of PostgreSQL 18 too), periods of
#               --day / --periods seconds, expired by dropping them
# A simulated day is --day seconds (default 240) and the ttl (idempotency.default_ttl) is one
# day; claims + completes at --rate per second (pgbench -R, --clients connections; 0.6.0 claims
# with deferred => true, 0.5.0 as it can) for --days days after a first day that fills the
# table; CALL idempotency.idem_sweep_all() every --sweep-every seconds (default: a day / 288,
# pg_cron's 5 minutes of 24 hours, at least 1 s). bench/simulate.py does the runs and writes,
# per period: claims' p50 / p99, WAL, dead tuples, table + index size, autovacuum runs, and the
# sweeps' own statement time; per day: the live records' own size against the tables'.
# Then, per design, expiring many records at once with claims going on at --drop-rate: a
# period of --drop-rows records (default 10 million; periods of --drop-period) dropped by the
# sweep, and --drop-delete-rows expired records (default 1 million) deleted by it.
#
#   bench/simulate.sh [--old VERSION|none] [--designs "delete partitions"] [--day S] [--periods N]
#                     [--days D] [--rate R] [--clients C] [--sweep-every S] [--drop-rows N]
#                     [--drop-delete-rows N] [--drop-period S] [--drop-rate R] [--conf LINE]...
#                     [--out DIR] [--keep] [--no-build] [--smoke]
#
#   --smoke       what CI runs (bench-smoke): --old none, days of 2 s in periods of 1 s, one day
#                 after the first, 50 claims a second, 5000 records expiring at once; checks the
#                 scripts, not the figures
#   --no-build    with --old VERSION: use the builds already in the copies
#   --keep        leave the last cluster running
# Compressed time: autovacuum_naptime = 1s and autovacuum_vacuum_cost_delay = 0 (a day of
# minutes would otherwise see a vacuum where a real one sees hundreds), checkpoints as the
# server's defaults; fsync = off (tests/lib.sh's clusters) unless --conf 'fsync = on'.
# Port: tests/lib.sh's bench row +3 (of PostgreSQL 18 with --old VERSION, else of PG_MAJOR, 15
# by default); folder dir_of simulate. Results in --out (default bench/results/simulate-<UTC
# time>): machine.txt, summary.md, periods.tsv, days.tsv, figures/*.svg, and per design and
# drop the raw files (pgbench logs, samples.tsv, tables.tsv, sweeps.tsv, drop.json).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

OLD=0.5.0
DESIGNS="delete partitions"
DAY=240
PERIODS=8
DAYS=3
RATE=500
CLIENTS=4
SWEEP_EVERY=""
DROP_ROWS=10000000
DROP_DELETE_ROWS=1000000
DROP_PERIOD=600
DROP_RATE=""
OUT=""
KEEP=0
BUILD=1
SMOKE=0
CONF=("shared_buffers = 1GB" "max_wal_size = 2GB" "autovacuum_naptime = 1s" "autovacuum_vacuum_cost_delay = 0")
while [ $# -gt 0 ]; do
    case $1 in
        --old) OLD=$2; shift 2 ;;
        --designs) DESIGNS=$2; shift 2 ;;
        --day) DAY=$2; shift 2 ;;
        --periods) PERIODS=$2; shift 2 ;;
        --days) DAYS=$2; shift 2 ;;
        --rate) RATE=$2; shift 2 ;;
        --clients) CLIENTS=$2; shift 2 ;;
        --sweep-every) SWEEP_EVERY=$2; shift 2 ;;
        --drop-rows) DROP_ROWS=$2; shift 2 ;;
        --drop-delete-rows) DROP_DELETE_ROWS=$2; shift 2 ;;
        --drop-period) DROP_PERIOD=$2; shift 2 ;;
        --drop-rate) DROP_RATE=$2; shift 2 ;;
        --conf) CONF+=("$2"); shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --keep) KEEP=1; shift ;;
        --no-build) BUILD=0; shift ;;
        --smoke) SMOKE=1; shift ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "simulate.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
if [ "$SMOKE" = 1 ]; then
    OLD=none; DAY=2; PERIODS=2; DAYS=1; RATE=50; CLIENTS=2; SWEEP_EVERY=1
    DROP_ROWS=5000; DROP_DELETE_ROWS=5000; DROP_PERIOD=2
fi
for n in "$DAY" "$PERIODS" "$DAYS" "$CLIENTS" "$DROP_PERIOD"; do
    [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "simulate.sh: '$n' is not a positive whole number" >&2; exit 2; }
done
[ $((DAY % PERIODS)) = 0 ] || { echo "simulate.sh: --day ($DAY) must be a multiple of --periods ($PERIODS): periods are whole seconds" >&2; exit 2; }
for d in $DESIGNS; do
    case $d in delete|partitions) ;; *) echo "simulate.sh: --designs: unknown design '$d' (delete partitions)" >&2; exit 2 ;; esac
done
PERIOD=$((DAY / PERIODS))
# The drop step's claims: seconds before the sweep, after it, and of each pgbench run.
DROP_TIMES=(--base 20 --after 3 --chunk 5)
[ "$SMOKE" = 1 ] && DROP_TIMES=(--base 1 --after 1 --chunk 1)
SWEEP_EVERY=${SWEEP_EVERY:-$($PY -c "print(max(1.0, $DAY / 288))")}
DROP_RATE=${DROP_RATE:-$RATE}

if [ "$OLD" = none ]; then
    extension_installed || { echo "simulate.sh: the extension is not installed into PostgreSQL $PG_MAJOR" >&2; exit 2; }
    MAJOR=$PG_MAJOR
else
    MAJOR=18
    use_major 18 || exit 2
    if [ "$BUILD" = 1 ]; then
        old_src=$(release_source "$OLD")
        copy_build "$OLD" "$old_src"
        copy_build tree "$ROOT"
    else
        copy_make "$OLD"
        copy_make tree
    fi
fi
PORT=$(( $(port_of bench "$MAJOR") + 3 ))   # tests/lib.sh: bench ports
CDIR=$(dir_of simulate "$MAJOR")
# The records expiring at once take about 400 bytes each with their index, and as much again
# in WAL and the table they are written past: refused up front rather than failing midway.
need_kb=$(( (DROP_ROWS > DROP_DELETE_ROWS ? DROP_ROWS : DROP_DELETE_ROWS) * 800 / 1024 + 4 * 1024 * 1024 ))
free_kb=$(df -Pk "$(dirname "$CDIR")" | awk 'NR == 2 { print $4 }')
[ "$free_kb" -ge "$need_kb" ] || {
    echo "simulate.sh: $((need_kb / 1048576 + 1)) GB free needed under $(dirname "$CDIR"), $((free_kb / 1048576)) GB there" >&2; exit 2; }
OUT=${OUT:-$BENCH/results/simulate-$(date -u +%Y%m%dT%H%M%SZ)$(if [ "$SMOKE" = 1 ]; then echo -smoke; fi)}
mkdir -p "$OUT"
cleanup() { [ "$KEEP" = 1 ] || { cluster_stop "$CDIR"; rm -rf "$CDIR"; }; }
trap cleanup EXIT

# on_design DESIGN: PGBIN (the server, psql, pgbench), the claim script and the words for it.
on_design() {
    case $1 in
        delete)
            if [ "$OLD" = none ]; then
                SCRIPT=$BENCH/scripts/simulate.ext_deferred.sql
                SETTINGS=("idempotency.partition_period = '0'")
                DESCRIPTION="this build with idempotency.partition_period = 0: every completed record in the far partition, expired ones deleted by idem_sweep_all"
            else
                PGBIN=$(copy_prefix "$OLD")/bin
                SCRIPT=$BENCH/scripts/simulate.ext.sql
                SETTINGS=()
                DESCRIPTION="release $OLD (built from its commit in sql/releases/past.tsv): one table, expired records deleted by idem_sweep_all"
            fi ;;
        partitions)
            [ "$OLD" = none ] || PGBIN=$(copy_prefix tree)/bin
            SCRIPT=$BENCH/scripts/simulate.ext_deferred.sql
            SETTINGS=("idempotency.partition_period = '${PERIOD}s'")
            DESCRIPTION="this build, idempotency.partition_period = ${PERIOD}s: a period dropped by idem_sweep_all once its records expired" ;;
    esac
}
# database NAME TTL SETTING...: a fresh database with the extension, the ttl and the settings.
database() {
    local name=$1 ttl=$2 s
    shift 2
    admin -c "DROP DATABASE IF EXISTS $name" -c "CREATE DATABASE $name" \
        -c "ALTER DATABASE $name SET idempotency.default_ttl = '$ttl'"
    for s in "$@"; do admin -c "ALTER DATABASE $name SET ${s%% = *} = ${s#* = }"; done
    DB=$name q -c "CREATE EXTENSION idempotency"
}
sim() { # sim run|drop ARGS...: bench/simulate.py against this cluster
    local cmd=$1
    shift
    $PY "$BENCH/simulate.py" "$cmd" --host "$CDIR/socket" --port "$PORT" --pgbench "$PGBIN/pgbench" "$@"
}

{
    echo "# bench/simulate.sh: expiry over compressed days (issue 35)"
    echo
    [ "$SMOKE" = 1 ] && echo "**A smoke run: the figures mean nothing.**" && echo
    echo "Command: \`bench/simulate.sh $*\`; a day of $DAY s in $PERIODS periods of $PERIOD s, $DAYS days after the first, claims at $RATE/s from $CLIENTS clients, a sweep every $SWEEP_EVERY s; then $DROP_ROWS records of a period (periods of $DROP_PERIOD s) and $DROP_DELETE_ROWS expired ones expiring at once, claims at $DROP_RATE/s. Settings: ${CONF[*]}. Machine: machine.txt."
    echo
} >"$OUT/summary.md"
: >"$OUT/machine.txt"
order=0
for design in $DESIGNS; do
    order=$((order + 1))
    use_major "$MAJOR"
    on_design "$design"
    echo "== $design: $DESCRIPTION"
    # One cluster for both designs when they run the same build, else one each.
    if [ "$OLD" != none ] || [ "$order" = 1 ]; then cluster_fresh "$CDIR" "$PORT" "${CONF[@]}"; fi
    database "sim_$design" "${DAY}s" "${SETTINGS[@]}"
    { echo "## $design"; DB=sim_$design machine_info; echo; } | tee -a "$OUT/machine.txt"
    sim run --db "sim_$design" --design "$design" --kind "$design" --description "$DESCRIPTION" --order "$order" \
        --day "$DAY" --periods "$PERIODS" --days "$DAYS" --rate "$RATE" --clients "$CLIENTS" \
        --sweep-every "$SWEEP_EVERY" --script "$SCRIPT" --out "$OUT/$design"
    rows=$([ "$design" = partitions ] && echo "$DROP_ROWS" || echo "$DROP_DELETE_ROWS")
    if [ "$rows" -gt 0 ]; then
        echo "== $design: $rows records expiring at once"
        drop_settings=("${SETTINGS[@]}")
        [ "$design" = partitions ] && drop_settings=("idempotency.partition_period = '${DROP_PERIOD}s'")
        database "drop_$design" "${DROP_PERIOD}s" "${drop_settings[@]}"
        sim drop --db "drop_$design" --mode "$design" --rows "$rows" --rate "$DROP_RATE" --clients "$CLIENTS" \
            "${DROP_TIMES[@]}" --script "$SCRIPT" --out "$OUT/drop-$design"
    fi
    [ "$KEEP" = 1 ] || [ "$OLD" = none ] || cluster_stop "$CDIR"
done

echo "== report"
$PY "$BENCH/simulate.py" report "$OUT" >/dev/null
$PY "$BENCH/plot.py" simulate "$OUT"
cat "$OUT/summary.md"
echo "results: $OUT"
