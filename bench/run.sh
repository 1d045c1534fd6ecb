#!/usr/bin/env bash
# The extension against the alternatives, on one throwaway cluster, in one command:
#   ext    the extension
#   ext_deferred  claim_complete only: the same-transaction path of 0.6.0, idem_claim(...,
#          deferred => true), whose complete writes the record once
#   ext_committed claim_complete only: committed first, the claim and the complete each in a
#          transaction of its own (the claim's record written, then moved by the complete)
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
#   limit  what the extension cannot beat: the bare prepared primary-key SELECT of the
#          stored record from idempotency.keys (replay, in_progress, mismatch), the bare
#          SELECT 1 from idempotency.messages (seen_dup), one bare INSERT of the same completed
#          row into idempotency.keys between BEGIN and COMMIT (claim_complete); summary.md
#          shows ext / limit
#   p1, p3 the scenario "partitions" only (issue 35): ext_deferred's script in a database of
#          its own (bench_p1, bench_p3) with idempotency.partition_period = 8h and
#          --partition-records live records, all in the period the new records go to (p1) or
#          spread evenly over it and the two periods before it (p3)
# in the scenarios of bench/scripts/<scenario>.<impl>.sql, with pgbench -n -M prepared -l.
# For each client count and scenario the implementations alternate, ext ext_spi peer floor portable
# limit ext ext_spi ..., for --rounds rounds, so that drift of a busy machine falls on all of them alike.
# Before each run a CHECKPOINT; after it, the WAL written and the writes pg_stat_user_tables
# counted in that database (rows inserted, updated, HOT-updated, deleted; n_dead_tup), per
# transaction. Then, for claim_complete, each implementation's writes with warm pages: one
# client, --wal-warm W M (default "2000 5000"): W transactions, then WAL and table counts over
# M more, with full_page_writes off meanwhile (summary.md's "Writes per request"): the WAL
# records themselves, as pages already written since the last checkpoint take them. (With
# random keys in an index of a million entries, 2,000 transactions warm few of its pages: the
# measured ones would still write full-page images, more for whichever runs first.)
# With --pg "15 18" there is one cluster per major and, within each round, the majors
# alternate too (ext peer floor on 15, then on 18); summary.md adds an 18-against-15 table.
#
#   bench/run.sh [--pg "15 18"] [--seconds S] [--clients "2 16"] [--rounds R] [--scenarios "a b"]
#                [--impls "ext limit"] [--nkeys N] [--partition-records N] [--wal-warm "W M"]
#                [--port P] [--dir DIR] [--out DIR] [--conf 'name = value']... [--keep] [--smoke]
#
#   --pg MAJORS      the PostgreSQL majors, one or several (default: $PG_MAJOR, else 15); the
#                    extension must be installed into each. Ports: tests/lib.sh's "bench" row
#   --seconds S      pgbench -T per run (default 10)
#   --clients LIST   client counts (default "2 16"); pgbench threads: 2 at most (2 cores)
#   --rounds R       rounds of alternation (default 2, at least 2 for figures)
#   --impls LIST     the implementations to run where a scenario has them (default: all of
#                    ext ext_deferred ext_committed ext_spi peer floor portable limit p1 p3)
#   --nkeys N        pre-populated records per implementation for replay / in_progress /
#                    mismatch / duplicate messages (default 100000)
#   --partition-records N  live records in bench_p1 and bench_p3 (default 1000000)
#   --wal-warm "W M" the warm-page step's transactions (default "2000 5000"; "0 0": none)
#   --scenarios      seen_many is not a pgbench script of its own: it runs bench/seen_many.sh
#                    (batches of 100 against 100 idem_seen calls and against its floor) on
#                    each major's cluster after the others, with --seconds, --rounds and 2
#                    clients, and appends its table to summary.md
#   --conf LINE      an extra postgresql.conf line, e.g. --conf 'fsync = on' (repeatable)
#   --smoke          what CI runs: 20 transactions per client instead of seconds, 2 clients,
#                    1 round, 1000 pre-populated keys and partition records, --wal-warm "20 50";
#                    checks the scripts, not the speed
#   --keep           leave the cluster(s) running afterwards (else stopped and removed)
#   --port / --dir   one major only
#
# Writes DIR/results (default bench/results/run-<UTC time>): runs.tsv, the pgbench logs and
# outputs, machine.txt, checks.md (the no-xid / no-lock checks), writes.tsv (the warm step),
# summary.md / summary.tsv / percentiles.tsv, and figures/*.svg (bench/plot.py: throughput by
# clients, latency percentiles, WAL and table writes per request).
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
SCENARIOS="claim_complete partitions replay in_progress mismatch seen_new seen_dup fp_1k fp_64k seen_many"
IMPLS="ext ext_deferred ext_committed ext_spi peer floor portable limit p1 p3"
PARTITION_RECORDS=1000000
WAL_WARM="2000 5000"
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
        --partition-records) PARTITION_RECORDS=$2; shift 2 ;;
        --wal-warm) WAL_WARM=$2; shift 2 ;;
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
    CLIENTS="2"; ROUNDS=1; NKEYS=1000; PARTITION_RECORDS=1000; WAL_WARM="20 50"
fi
for i in $IMPLS; do
    case $i in ext|ext_deferred|ext_committed|ext_spi|peer|floor|portable|limit|p1|p3) ;;
        *) echo "run.sh: --impls: unknown implementation '$i' (ext ext_deferred ext_committed ext_spi peer floor portable limit p1 p3)" >&2; exit 2 ;;
    esac
done
read -r WARM_FIRST WARM_MEASURED <<<"$WAL_WARM"
[[ "$WARM_FIRST $WARM_MEASURED" =~ ^[0-9]+\ [0-9]+$ ]] || { echo "run.sh: --wal-warm needs two numbers, e.g. \"2000 5000\"" >&2; exit 2; }
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
    if [[ " $SCENARIOS " == *" partitions "* ]]; then
        for spread in 1 3; do
            echo "== database bench_p$spread: $PARTITION_RECORDS live records over $spread period(s) of 8 hours"
            admin -c "CREATE DATABASE bench_p$spread" -c "ALTER DATABASE bench_p$spread SET idempotency.partition_period = '8h'"
            DB=bench_p$spread q -v spread="$spread" -v n="$PARTITION_RECORDS" -f "$BENCH/populate_partitions.sql" >"$OUT/setup-p$spread-pg$m.log"
        done
    fi
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

# script_of SCENARIO IMPL: the pgbench script (portable and ext_spi run ext's; p1 and p3, the
# scenario partitions, run ext_deferred's claim_complete in their own databases).
script_of() {
    case $2 in
        portable|ext_spi) echo "$BENCH/scripts/$1.ext.sql" ;;
        p1|p3) echo "$BENCH/scripts/claim_complete.ext_deferred.sql" ;;
        *) echo "$BENCH/scripts/$1.$2.sql" ;;
    esac
}
db_of() { case $1 in portable) echo "$PORTABLE_DB" ;; p1|p3) echo "bench_$1" ;; *) echo "$DB" ;; esac; }
impls_of() {
    local s=$1 i
    for i in $IMPLS; do
        [ "$i" = ext_spi ] && [[ " $READ_PATH_SCENARIOS " != *" $s "* ]] && continue
        [[ $i == p[13] ]] && [ "$s" != partitions ] && continue
        [ -f "$(script_of "$s" "$i")" ] && echo "$i"
    done
    return 0
}
# table_counts DB: rows inserted, updated, HOT-updated, deleted and n_dead_tup, summed over the
# tables of that database (the extension's partitions, the peer's and the floor's tables), once
# the sessions of a run have left (a backend reports its counts when it exits).
table_counts() {
    local i
    for i in $(seq 100); do
        [ "$(DB=$1 q -c "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'")" = 0 ] && break
        sleep 0.05
    done
    DB=$1 q -F $'\t' -c "SELECT pg_stat_force_next_flush()" \
        -c "SELECT coalesce(sum(n_tup_ins), 0), coalesce(sum(n_tup_upd), 0), coalesce(sum(n_tup_hot_upd), 0),
                   coalesce(sum(n_tup_del), 0), coalesce(sum(n_dead_tup), 0)
              FROM pg_stat_user_tables WHERE relname <> 'bench_docs'" | tail -n 1
}
# counts_diff BEFORE AFTER: the five counts' differences, tab-separated.
counts_diff() {
    local -a a b
    read -r -a a <<<"$1"; read -r -a b <<<"$2"
    printf '%s\t%s\t%s\t%s\t%s' $((b[0] - a[0])) $((b[1] - a[1])) $((b[2] - a[2])) $((b[3] - a[3])) $((b[4] - a[4]))
}

printf 'clients\tscenario\timpl\tround\tlog_prefix\tpgbench_tps\txids\twal_bytes\tstarted\tpg\tins\tupd\thot_upd\tdel\tdead\n' >"$OUT/runs.tsv"
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
                db=$(db_of "$i"); options=${PGOPTIONS:-}
                q -c "CHECKPOINT"
                n0=$(table_counts "$db")
                x0=$(xid_next); l0=$(wal_lsn); t0=$(date +%s)
                if [ "$SMOKE" = 1 ]; then length=(-t 20); else length=(-T "$SECONDS_PER_RUN"); fi
                # ext_spi: the ext script with the direct read path off in every session.
                [ "$i" = ext_spi ] && options+=" -c idempotency.direct_read=off"
                PGOPTIONS=$options pgbench -h "$CDIR/socket" -p "$PORT" -U postgres -n -M prepared -c "$c" -j "$threads" \
                    "${length[@]}" -D nkeys="$NKEYS" -l --log-prefix="$OUT/logs/$name" \
                    -f "$(script_of "$s" "$i")" "$db" >"$OUT/logs/$name.out" 2>&1 || {
                    echo "pgbench failed for $name:"; cat "$OUT/logs/$name.out"; exit 1; }
                x1=$(xid_next); l1=$(wal_lsn)
                n1=$(table_counts "$db")
                tps=$(sed -n 's/^tps = \([0-9.]*\) (without.*/\1/p' "$OUT/logs/$name.out")
                printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$c" "$s" "$i" "$r" "logs/$name" "$tps" \
                    "$((x1 - x0))" "$(wal_diff "$l0" "$l1")" "$t0" "$m" "$(counts_diff "$n0" "$n1")" >>"$OUT/runs.tsv"
                printf 'pg%s %-16s %-8s c=%-3s round %s: %10s tps\n' "$m" "$s" "$i" "$c" "$r" "$tps"
            done
          done
        done
    done
done

# Writes per request with warm pages (issue 34's method): claim_complete's implementations, one
# client, WARM_FIRST transactions and then WARM_MEASURED measured, no CHECKPOINT in between.
printf 'pg\timpl\ttransactions\twal_bytes\tins\tupd\thot_upd\tdel\tdead\n' >"$OUT/writes.tsv"
if [[ " $SCENARIOS " == *" claim_complete "* ]] && [ "$WARM_MEASURED" -gt 0 ]; then
    echo "== writes per request, warm pages: $WARM_FIRST transactions, then $WARM_MEASURED measured (1 client)"
    for m in "${MAJORS[@]}"; do
        on_major "$m"
        # full_page_writes is reloaded by the checkpointer, which tells the backends.
        q -c "ALTER SYSTEM SET full_page_writes = off" -c "SELECT pg_reload_conf()" >/dev/null
        sleep 1
        for i in $(impls_of claim_complete); do
            [ "$i" = ext_spi ] && continue  # writes what ext writes
            db=$(db_of "$i")
            bench_warm=(pgbench -h "$CDIR/socket" -p "$PORT" -U postgres -n -M prepared -c 1 -f "$(script_of claim_complete "$i")" "$db")
            [ "$WARM_FIRST" -gt 0 ] && { "${bench_warm[@]}" -t "$WARM_FIRST" >/dev/null 2>&1 || { echo "pgbench failed (warm-up of $i)"; exit 1; }; }
            n0=$(table_counts "$db"); l0=$(wal_lsn)
            "${bench_warm[@]}" -t "$WARM_MEASURED" >"$OUT/logs/warm.$i.pg$m.out" 2>&1 || {
                echo "pgbench failed (warm $i):"; cat "$OUT/logs/warm.$i.pg$m.out"; exit 1; }
            l1=$(wal_lsn); n1=$(table_counts "$db")
            wal=$(wal_diff "$l0" "$l1")
            printf '%s\t%s\t%s\t%s\t%s\n' "$m" "$i" "$WARM_MEASURED" "$wal" "$(counts_diff "$n0" "$n1")" >>"$OUT/writes.tsv"
            printf 'pg%s %-14s %6s B of WAL per request\n' "$m" "$i" "$((wal / WARM_MEASURED))"
        done
        q -c "ALTER SYSTEM RESET full_page_writes" -c "SELECT pg_reload_conf()" >/dev/null
    done
fi

echo "== summary"
$PY "$BENCH/latency.py" summarize "$OUT"
if [[ " $SCENARIOS " == *" seen_many "* ]]; then
    for m in "${MAJORS[@]}"; do
        on_major "$m"
        echo "== idem_seen_many, PostgreSQL $m (bench/seen_many.sh)"
        many_args=(--seconds "$SECONDS_PER_RUN" --rounds "$ROUNDS")
        [ "$SMOKE" = 1 ] && many_args=(--transactions 5 --rounds 1 --ndup 1000)
        PGHOST=$CDIR/socket PGPORT=$PORT PGUSER=postgres OUT=$OUT/seen_many-pg$m \
            "$BENCH/seen_many.sh" "${many_args[@]}" >"$OUT/logs/seen_many-pg$m.out" 2>&1 || {
            echo "seen_many.sh failed:"; cat "$OUT/logs/seen_many-pg$m.out"; exit 1; }
        { echo; echo "## idem_seen_many, PostgreSQL $m"; echo; cat "$OUT/seen_many-pg$m/summary.md"; } |
            tee -a "$OUT/summary.md"
    done
fi
$PY "$BENCH/plot.py" run "$OUT"
echo "results: $OUT"
