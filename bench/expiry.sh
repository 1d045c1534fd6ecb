#!/usr/bin/env bash
# Expiry at scale, on a throwaway cluster of its own, in one command:
#
#  1. levels   claim+complete (bench/scripts/claim_complete.ext.sql) throughput, p50 and p99
#              with each client count, at each number of live records (default 10 thousand,
#              1 million, 10 million; made with INSERT ... SELECT generate_series). The rows
#              a run claims are deleted after it, so every run starts at its level.
#  2. sweep    at the largest level, --expired expired records (default 1 million) are added,
#              then idem_sweep_all deletes them while one pgbench run keeps claiming at a
#              fixed rate from --sweep-clients connections (default 8; at a quarter of what 2
#              clients reached at the largest level, or --sweep-rate): the sweep rate in rows
#              per second, the claims' p50 / p99 during the sweep against the 20 s of the same
#              run just before it, and table and index sizes before the sweep, after it, and
#              after a VACUUM. Once for each word of --sweep-variants (sweep_cmd below;
#              default "default fast default fast": idem_sweep_all's defaults, batches of 200
#              with 4 ms pauses, and batches of 10000 back to back, twice each, alternating),
#              each on a fresh set of expired records.
#  3. churn    for each storage configuration (default; fillfactor 85; aggressive table-level
#              autovacuum; both; and an experiment without the partial index, which lets the
#              complete be a HOT update), a database of its own with --churn-base live records,
#              then --churn-seconds of claims + completes with a 60 s ttl at --churn-rate per
#              second while idem_sweep_all runs every 10 s: dead tuples, table and index
#              sizes, HOT updates, autovacuum runs and claim p50 / p99.
#
#   bench/expiry.sh [--seconds S] [--clients "2 16"] [--rounds R] [--levels "10000 1000000 10000000"]
#                   [--expired N] [--sweep-rate TPS] [--sweep-variants "default fast 1000/20ms"]
#                   [--sweep-clients N]
#                   [--churn-seconds S] [--churn-rate TPS]
#                   [--churn-base N] [--configs "default ff85 av ff85_av ff85_nopartial"]
#                   [--phases "levels sweep churn"] [--port P] [--dir DIR] [--out DIR]
#                   [--conf 'name = value']... [--keep] [--smoke]
#
#   --smoke: tiny sizes and durations (levels 1000 and 20000, 20000 expired, 8 s of churn per
#   configuration): checks that the script works, not the figures.
#
# Writes OUT (default bench/results/expiry-<UTC time>): machine.txt, levels.tsv, sweep-*.notice,
# churn/<config>/samples.tsv, the pgbench logs, and summary.md (printed at the end).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

SECONDS_PER_RUN=10
CLIENTS="2 16"
ROUNDS=2
LEVELS="10000 1000000 10000000"
EXPIRED=1000000
SWEEP_RATE=""
SWEEP_VARIANTS="default fast default fast"
SWEEP_CLIENTS=8
CHURN_SECONDS=180
CHURN_RATE=500
CHURN_BASE=500000
CONFIGS="default ff85 av ff85_av ff85_nopartial"
PHASES="levels sweep churn"
PORT=$(( $(port_of bench) + 1 ))   # tests/lib.sh: bench ports
CDIR=/tmp/idempotency-expiry-$PORT
OUT=""
KEEP=0
SMOKE=0
CONF=("shared_buffers = 2GB" "max_wal_size = 8GB" "checkpoint_timeout = 30min")
while [ $# -gt 0 ]; do
    case $1 in
        --seconds) SECONDS_PER_RUN=$2; shift 2 ;;
        --clients) CLIENTS=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --levels) LEVELS=$2; shift 2 ;;
        --expired) EXPIRED=$2; shift 2 ;;
        --sweep-rate) SWEEP_RATE=$2; shift 2 ;;
        --sweep-variants) SWEEP_VARIANTS=$2; shift 2 ;;
        --sweep-clients) SWEEP_CLIENTS=$2; shift 2 ;;
        --churn-seconds) CHURN_SECONDS=$2; shift 2 ;;
        --churn-rate) CHURN_RATE=$2; shift 2 ;;
        --churn-base) CHURN_BASE=$2; shift 2 ;;
        --configs) CONFIGS=$2; shift 2 ;;
        --phases) PHASES=$2; shift 2 ;;
        --port) PORT=$2; CDIR=/tmp/idempotency-expiry-$PORT; shift 2 ;;
        --dir) CDIR=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --conf) CONF+=("$2"); shift 2 ;;
        --keep) KEEP=1; shift ;;
        --smoke) SMOKE=1; shift ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "expiry.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
if [ "$SMOKE" = 1 ]; then
    SECONDS_PER_RUN=2; CLIENTS="2"; ROUNDS=1; LEVELS="1000 20000"; EXPIRED=20000
    CHURN_SECONDS=8; CHURN_RATE=200; CHURN_BASE=5000
fi
OUT=${OUT:-$BENCH/results/expiry-$(date -u +%Y%m%dT%H%M%SZ)$(if [ "$SMOKE" = 1 ]; then echo -smoke; fi)}
mkdir -p "$OUT/logs"
SUMMARY=$OUT/summary.md
: >"$SUMMARY"

BG_PIDS=()
cleanup() {
    for p in "${BG_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    if [ "$KEEP" = 0 ]; then
        cluster_stop "$CDIR"
        rm -rf "$CDIR"
    fi
}
trap cleanup EXIT

# pgbench against this cluster, prepared, with a per-transaction log.
PGBENCH=(pgbench -h "$CDIR/socket" -p "$PORT" -U postgres -n -M prepared -l)
pgb() {  # pgb DB LOGPREFIX pgbench-args...
    local db=$1 prefix=$2; shift 2
    "${PGBENCH[@]}" --log-prefix="$prefix" "$@" "$db"
}
window() { $PY "$BENCH/latency.py" window "$@"; }
jget() { $PY -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }
now_s() { date +%s.%N; }
sizes() {  # one Markdown row: table, indexes, total, live and dead tuples
    q -c "SELECT '| $1 | ' || pg_size_pretty(pg_relation_size('idempotency.keys')) || ' | ' ||
                 pg_size_pretty(pg_indexes_size('idempotency.keys')) || ' | ' ||
                 pg_size_pretty(pg_total_relation_size('idempotency.keys')) || ' | ' ||
                 (SELECT count(*) FROM idempotency.keys) || ' | ' ||
                 (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'idempotency.keys'::regclass) || ' |'"
}
populate() {  # populate FROM TO EXPIRED(0|1), in batches of a million
    local from=$1 to=$2 expired=$3 b
    for ((b = from; b <= to; b += 1000000)); do
        local e=$(( b + 999999 < to ? b + 999999 : to ))
        q -v from="$b" -v to="$e" -v expired="$expired" -f "$BENCH/populate_live.sql"
    done
}

echo "== cluster $CDIR on port $PORT; results in $OUT"
cluster_fresh "$CDIR" "$PORT" "${CONF[@]}"
DB=expiry
admin -c "CREATE DATABASE $DB"
q -c "CREATE EXTENSION idempotency; CREATE EXTENSION pgstattuple"
machine_info | tee "$OUT/machine.txt"
SCOPE="acct_42 POST /charges"  # the scope bench/scripts/claim_complete.ext.sql claims in
LAST_LEVEL=0
LAST_TPS2=""

# ---------------------------------------------------------------------------------- levels
if [[ " $PHASES " == *" levels "* || " $PHASES " == *" sweep "* ]]; then
    {
        echo "### Claim + complete at each number of live records"
        echo
        echo "| live records | clients | tps | p50 ms | p99 ms | table | indexes |"
        echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    } >>"$SUMMARY"
    printf 'level\tclients\tround\ttps\tp50_ms\tp99_ms\n' >"$OUT/levels.tsv"
    have=0
    for level in $LEVELS; do
        echo "== level $level: adding $((level - have)) live records"
        t0=$(now_s)
        populate $((have + 1)) "$level" 0
        have=$level
        q -c "VACUUM ANALYZE idempotency.keys"
        echo "   populated in $(echo "$(now_s) - $t0" | bc) s"
        for c in $CLIENTS; do
            prefixes=()
            for r in $(seq 1 "$ROUNDS"); do
                p=$OUT/logs/level$level.c$c.r$r
                pgb "$DB" "$p" -c "$c" -j $(( c < 2 ? c : 2 )) -T "$SECONDS_PER_RUN" \
                    -f "$BENCH/scripts/claim_complete.ext.sql" >"$p.out" 2>&1 || echo "pgbench failed, see $p.out" >&2
                w=$(window "$p")
                printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$level" "$c" "$r" "$(jget tps <<<"$w")" \
                    "$(jget p50_ms <<<"$w")" "$(jget p99_ms <<<"$w")" >>"$OUT/levels.tsv"
                prefixes+=("$p")
                # Back to the level: the claims of this run go (their scope is the bench's own).
                q -c "DELETE FROM idempotency.keys WHERE scope = '$SCOPE'" -c "VACUUM idempotency.keys"
            done
            w=$(window "${prefixes[@]}")
            # tps: mean of the rounds' tps; p50/p99 over all their transactions.
            tps=$(awk -F'\t' -v l="$level" -v c="$c" '$1 == l && $2 == c {s += $4; n++} END {printf "%.0f", s / n}' "$OUT/levels.tsv")
            [ "$c" = 2 ] && LAST_TPS2=$tps
            sz=$(q -c "SELECT pg_size_pretty(pg_relation_size('idempotency.keys')) || ' | ' || pg_size_pretty(pg_indexes_size('idempotency.keys'))")
            echo "| $level | $c | $tps | $(jget p50_ms <<<"$w") | $(jget p99_ms <<<"$w") | $sz |" | tee -a "$SUMMARY"
        done
    done
    LAST_LEVEL=$have
    echo >>"$SUMMARY"
fi

# ----------------------------------------------------------------------------------- sweep
# sweep_cmd VARIANT: the statement that sweeps.
#   default      CALL idempotency.idem_sweep_all(): batches of 200, a 4 ms pause after each
#   fast         CALL idempotency.idem_sweep_all(10000, '0'): batches of 10000 back to back
#                (0.2.0's default)
#   BATCH/PAUSE  CALL idempotency.idem_sweep_all(BATCH, 'PAUSE'), e.g. 1000/20ms
#   busy         a control, not a sweep: a backend that spins for 12 s without touching a
#                table (no expired records are added for it)
sweep_cmd() {
    case $1 in
        busy) echo "DO \$\$ DECLARE t timestamptz := clock_timestamp(); BEGIN WHILE clock_timestamp() < t + interval '12 s' LOOP END LOOP; END \$\$" ;;
        default) echo "CALL idempotency.idem_sweep_all()" ;;
        fast) echo "CALL idempotency.idem_sweep_all(10000, '0')" ;;
        */*) echo "CALL idempotency.idem_sweep_all(${1%%/*}, '${1#*/}')" ;;
        *) echo "unknown sweep variant $1" >&2; exit 2 ;;
    esac
}
if [[ " $PHASES " == *" sweep "* ]]; then
    rate=${SWEEP_RATE:-$(( ${LAST_TPS2:-2000} / 4 ))}
    next_id=$((LAST_LEVEL + 1))
    n_sweep=0
    printf 'variant\tseconds\trows\trows_per_s\tclaims_per_s\tp99_ms_without\tp99_ms_during\tratio\town_p99_ms_without\town_p99_ms_during\town_ratio\n' >"$OUT/sweeps.tsv"
    for sv in $SWEEP_VARIANTS; do
        n_sweep=$((n_sweep + 1))
        svf=$n_sweep-${sv//\//-}  # in file names
        if [ "$sv" != busy ]; then
            echo "== sweep ($sv): adding $EXPIRED expired records to $LAST_LEVEL live ones; claims at $rate/s"
            populate "$next_id" $((next_id + EXPIRED - 1)) 1
            next_id=$((next_id + EXPIRED))
        fi
        q -c "VACUUM ANALYZE idempotency.keys"
        {
            [ "$sv" = busy ] && echo "### Control: a busy backend that touches no table, among $LAST_LEVEL live records" ||
            echo "### Sweeping $EXPIRED expired records among $LAST_LEVEL live ones: $(sweep_cmd "$sv")"
            echo
            echo "| when | table | indexes | total | rows | dead tuples |"
            echo "| --- | ---: | ---: | ---: | ---: | ---: |"
            sizes "before the sweep"
        } >>"$SUMMARY"

        # One pgbench run at a fixed rate, its connections open throughout: base_s seconds
        # without a sweep (after 3 s of warm-up), then the sweep, then 3 s more; then it is
        # killed (its logs are complete up to their last few milliseconds, after the window).
        # Not through pgb: $! must be pgbench itself, not a subshell running a function.
        base_s=$([ "$SMOKE" = 1 ] && echo 4 || echo 20)
        p=$OUT/logs/sweep-$svf
        "${PGBENCH[@]}" --log-prefix="$p" -c "$SWEEP_CLIENTS" -j 2 -R "$rate" -T 3600 \
            -f "$BENCH/scripts/claim_complete.ext.sql" "$DB" >"$p.out" 2>&1 &
        BG_PIDS+=($!); pg_pid=$!
        sleep $((base_s + 3))
        l0=$(wal_lsn)
        ts=$(now_s)
        q -c "$(sweep_cmd "$sv")" 2>"$OUT/sweep-$svf.notice"
        te=$(now_s)
        wal=$(wal_diff "$l0" "$(wal_lsn)")
        sleep 3
        kill -TERM "$pg_pid" 2>/dev/null || true
        wait "$pg_pid" 2>/dev/null || true
        base=$(window "$p" --from "$(echo "$ts - $base_s" | bc)" --to "$ts")
        during=$(window "$p" --from "$ts" --to "$te")
        deleted=$(sed -n 's/.*deleted \([0-9]*\) expired rows.*/\1/p' "$OUT/sweep-$svf.notice")
        deleted=${deleted:-0}
        secs=$(echo "$te - $ts" | bc)
        sizes "after the sweep" >>"$SUMMARY"
        q -c "VACUUM idempotency.keys"
        sizes "after VACUUM" >>"$SUMMARY"
        ratio=$($PY -c "print(round($(jget p99_ms <<<"$during") / $(jget p99_ms <<<"$base"), 2))")
        own_ratio=$($PY -c "print(round($(jget p99_service_ms <<<"$during") / $(jget p99_service_ms <<<"$base"), 2))")
        rows_s=$([ "$deleted" -gt 0 ] && echo "scale=0; $deleted / $secs" | bc || echo 0)
        free=$(q -c "SELECT round(approx_free_percent::numeric, 1) || ' % free space, ' || round(dead_tuple_percent::numeric, 1) || ' % dead' FROM pgstattuple_approx('idempotency.keys')")
        {
            echo
            echo "Table after VACUUM: $free (pgstattuple_approx)."
            echo
            echo "| | seconds | claims | claims/s | p50 ms | p99 ms | max ms | own p50 ms | own p99 ms |"
            echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
            for w in base during; do
                j=${!w}
                label=$([ $w = base ] && echo "no sweep" || echo "during the sweep")
                echo "| claims at $rate/s, $label | $(jget seconds <<<"$j") | $(jget n <<<"$j") | $(jget tps <<<"$j") | $(jget p50_ms <<<"$j") | $(jget p99_ms <<<"$j") | $(jget max_ms <<<"$j") | $(jget p50_service_ms <<<"$j") | $(jget p99_service_ms <<<"$j") |"
            done
            echo
            echo "($SWEEP_CLIENTS clients. p50 / p99: from each claim's scheduled start, as the client waits for it, schedule lag included; own: the transaction's own time, lag left out.)"
            echo
            [ "$sv" = busy ] && echo "A backend busy for $secs s ($(sweep_cmd busy));" ||
            echo "Sweep ($(sweep_cmd "$sv")): $deleted rows in $secs s = **$rows_s rows/s**, $(echo "scale=0; $wal / $deleted" | bc) bytes of WAL per row swept (claims' WAL included);"
            echo "claims' p99 during it / without it: **${ratio}x** (own time: **${own_ratio}x**)."
            echo
        } | tee -a "$SUMMARY"
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$svf" "$secs" "$deleted" "$rows_s" "$rate" \
            "$(jget p99_ms <<<"$base")" "$(jget p99_ms <<<"$during")" "$ratio" \
            "$(jget p99_service_ms <<<"$base")" "$(jget p99_service_ms <<<"$during")" "$own_ratio" >>"$OUT/sweeps.tsv"
    done
fi

# ----------------------------------------------------------------------------------- churn
config_sql() {
    case $1 in
        default) echo "" ;;
        ff85) echo "ALTER TABLE idempotency.keys SET (fillfactor = 85);" ;;
        av) echo "ALTER TABLE idempotency.keys SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_insert_scale_factor = 0.01, autovacuum_vacuum_cost_delay = 0);" ;;
        ff85_av) echo "ALTER TABLE idempotency.keys SET (fillfactor = 85, autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_insert_scale_factor = 0.01, autovacuum_vacuum_cost_delay = 0);" ;;
        ff85_nopartial) echo "ALTER TABLE idempotency.keys SET (fillfactor = 85); DROP INDEX idempotency.keys_in_progress_idx;" ;;
        *) echo "unknown configuration $1" >&2; exit 2 ;;
    esac
}
if [[ " $PHASES " == *" churn "* ]]; then
    {
        echo "### High churn: $CHURN_SECONDS s of claims + completes (ttl 60 s) at $CHURN_RATE/s, 2 clients, idem_sweep_all every 10 s, $CHURN_BASE live records to start"
        echo
        echo "| configuration | claims/s | p50 ms | p99 ms | dead tuples max / mean | table start → end | indexes start → end | HOT updates | autovacuums | swept |"
        echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    } >>"$SUMMARY"
    for cfg in $CONFIGS; do
        echo "== churn: $cfg"
        d=$OUT/churn/$cfg
        mkdir -p "$d"
        DB=churn_$cfg
        admin -c "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB"
        q -c "CREATE EXTENSION idempotency"
        sql=$(config_sql "$cfg")
        [ -n "$sql" ] && q -c "$sql"
        populate 1 "$CHURN_BASE" 0
        q -c "VACUUM ANALYZE idempotency.keys"
        q -c "SELECT pg_stat_reset()"
        start_sizes=$(q -c "SELECT pg_size_pretty(pg_relation_size('idempotency.keys')) || '|' || pg_size_pretty(pg_indexes_size('idempotency.keys'))")
        # Sampler: every 5 s.
        (
            printf 't\tlive\tdead\ttable_bytes\tindex_bytes\tautovacuums\tupdates\thot_updates\n'
            while :; do
                q -F $'\t' -c "SELECT extract(epoch FROM now())::int, n_live_tup, n_dead_tup, pg_relation_size(relid), pg_indexes_size(relid), autovacuum_count, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'idempotency.keys'::regclass" || true
                sleep 5
            done
        ) >"$d/samples.tsv" &
        BG_PIDS+=($!); sampler=$!
        # Sweeper: idem_sweep_all every 10 s (pg_cron would run it every few minutes on a
        # 24 h ttl; 10 s on a 60 s ttl keeps the same proportion).
        (
            while :; do
                sleep 10
                q -c "CALL idempotency.idem_sweep_all()" 2>&1 | sed -n 's/.*deleted \([0-9]*\) expired rows.*/\1/p' || true
            done
        ) >"$d/sweeps.txt" &
        BG_PIDS+=($!); sweeper=$!
        pgb "$DB" "$d/claims" -c 2 -j 2 -R "$CHURN_RATE" -T "$CHURN_SECONDS" -D ttl=60s \
            -f "$BENCH/scripts/churn.ext.sql" >"$d/claims.out" 2>&1 || echo "pgbench failed, see $d/claims.out" >&2
        kill "$sampler" "$sweeper" 2>/dev/null || true
        wait "$sampler" "$sweeper" 2>/dev/null || true
        sleep 1
        w=$(window "$d/claims")
        end_sizes=$(q -c "SELECT pg_size_pretty(pg_relation_size('idempotency.keys')) || '|' || pg_size_pretty(pg_indexes_size('idempotency.keys'))")
        stats=$($PY - "$d/samples.tsv" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])][1:]
rows = [r for r in rows if len(r) == 8 and r[0].isdigit()]
dead = [int(r[2]) for r in rows] or [0]
last = rows[-1] if rows else ["0"] * 8
upd, hot = int(last[6]), int(last[7])
print(f"{max(dead):,} / {sum(dead) // len(dead):,}|{hot / upd * 100 if upd else 0:.0f} %|{last[5]}")
PY
)
        swept=$(awk '{s += $1} END {print s + 0}' "$d/sweeps.txt")
        IFS='|' read -r t0s i0s <<<"$start_sizes"
        IFS='|' read -r t1s i1s <<<"$end_sizes"
        IFS='|' read -r deadstat hotpct avs <<<"$stats"
        echo "| $cfg | $(jget tps <<<"$w") | $(jget p50_ms <<<"$w") | $(jget p99_ms <<<"$w") | $deadstat | $t0s → $t1s | $i0s → $i1s | $hotpct | $avs | $swept |" | tee -a "$SUMMARY"
        admin -c "DROP DATABASE $DB"
    done
    {
        echo
        echo "Configurations: default = as installed; ff85 = \`fillfactor = 85\`; av = \`autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_insert_scale_factor = 0.01, autovacuum_vacuum_cost_delay = 0\`;"
        echo "ff85_av = both; ff85_nopartial = fillfactor 85 and keys_in_progress_idx dropped (an experiment: with no index on locked_until or status, completing a claim can be a HOT update; idem_reclaim_stale would then have to scan)."
        echo
    } >>"$SUMMARY"
fi

echo "== summary"
cat "$SUMMARY"
echo "results: $OUT"
