#!/usr/bin/env bash
# What each part of idempotency.keys costs a claim + complete
# (bench/scripts/claim_complete.ext.sql), on the table as installed and in variants
# (bench/lib.sh variant_sql):
#   installed  as CREATE EXTENSION makes it (releases 0.2.0 and 0.3.0: the same table)
#   v010       release 0.1.0's table: three CHECK constraints (PostgreSQL 15 parses and plans
#              each again for every INSERT and UPDATE), and keys_in_progress_idx with the
#              predicate "status = 'in_progress'" only, which idem_complete's fenced UPDATE
#              implies: on a table of mostly completed records the planner ran that UPDATE as
#              a scan of every in_progress entry (live and dead) with a filter on scope and key
#   noexpidx   without keys_expires_at_idx (what idem_sweep reads expired records by)
#   hot        without keys_in_progress_idx (what idem_reclaim_stale and idempotency.stats read
#              claims in flight by): completing a claim becomes a HOT update
#   pkonly     with neither: the least a table with these columns can cost
#   peer       the PL/pgSQL peer (bench/plpgsql_peer.sql) on the same records, for reference
#   floor      the raw SQL floor (bench/setup.sql's idempotency_keys) on the same records
# Each variant gets a database of its own with --rows completed records (ANALYZEd, as a
# production table would be); the variants alternate in every round.
#
#   bench/variants.sh [--seconds S] [--clients "2 16"] [--rounds R] [--rows N]
#                     [--variants "installed v010 noexpidx hot pkonly peer floor"] [--port P] [--out DIR] [--smoke]
set -euo pipefail
. "$(dirname "$0")/lib.sh"

SECONDS_PER_RUN=10; CLIENTS="2 16"; ROUNDS=3; ROWS=1000000
VARIANTS="installed v010 noexpidx hot pkonly peer floor"; PORT=$(( $(port_of bench) + 4 )); OUT=""; SMOKE=0
while [ $# -gt 0 ]; do
    case $1 in
        --seconds) SECONDS_PER_RUN=$2; shift 2 ;;
        --clients) CLIENTS=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --rows) ROWS=$2; shift 2 ;;
        --variants) VARIANTS=$2; shift 2 ;;
        --port) PORT=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --smoke) SMOKE=1; shift ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "variants.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ "$SMOKE" = 1 ] && { SECONDS_PER_RUN=1; CLIENTS=2; ROUNDS=1; ROWS=10000; }
CDIR=/tmp/idempotency-variants-$PORT
OUT=${OUT:-$BENCH/results/variants-$(date -u +%Y%m%dT%H%M%SZ)$(if [ "$SMOKE" = 1 ]; then echo -smoke; fi)}
mkdir -p "$OUT/logs"
trap 'cluster_stop "$CDIR"; rm -rf "$CDIR"' EXIT

echo "== cluster $CDIR on port $PORT; results in $OUT"
cluster_fresh "$CDIR" "$PORT" "shared_buffers = 1GB" "max_wal_size = 4GB" "checkpoint_timeout = 30min"
impl_of() { case $1 in peer|floor) echo "$1" ;; *) echo ext ;; esac; }
cleanup_sql() {
    case $1 in
        peer) echo "DELETE FROM peer.keys WHERE scope = 'acct_42 POST /charges'" ;;
        floor) echo "DELETE FROM idempotency_keys WHERE key LIKE 'n-%'" ;;
        *) echo "DELETE FROM idempotency.keys WHERE scope = 'acct_42 POST /charges'" ;;
    esac
}
for v in $VARIANTS; do
    admin -c "CREATE DATABASE v_$v"
    DB=v_$v
    q -c "CREATE EXTENSION idempotency"
    case $v in
        peer|floor)
            q -f "$BENCH/plpgsql_peer.sql" >/dev/null 2>&1
            q -c "CREATE TABLE idempotency_keys (id bigserial PRIMARY KEY, key text UNIQUE, fingerprint text, status text, response jsonb, expires_at timestamptz)" ;;
        *) sql=$(variant_sql "$v"); [ -n "$sql" ] && q -c "$sql" ;;
    esac
    q -v from=1 -v to="$ROWS" -v expired=0 -f "$BENCH/populate_live.sql"
    case $v in
        peer) q -c "INSERT INTO peer.keys SELECT * FROM idempotency.keys" -c "TRUNCATE idempotency.keys"
              T=peer.keys ;;
        floor) q -c "INSERT INTO idempotency_keys (key, fingerprint, status, response, expires_at) SELECT scope || ':' || key, fingerprint, status, jsonb_build_object('status', response_status, 'headers', response_headers, 'body', response_body), expires_at FROM idempotency.keys" -c "TRUNCATE idempotency.keys"
              T=idempotency_keys ;;
        *) T=idempotency.keys ;;
    esac
    q -c "VACUUM ANALYZE"
    [ "$v" = floor ] && continue
    # The plan PostgreSQL picks for idem_complete's UPDATE (same text as src/lifecycle.rs).
    plan=$(q -c "SET plan_cache_mode = force_generic_plan" -c "PREPARE c(text, text, uuid, int, jsonb, jsonb, timestamptz) AS UPDATE $T SET status = 'completed', locked_until = NULL, response_status = \$4, response_headers = \$5, response_body = \$6, completed_at = \$7, updated_at = \$7 WHERE scope OPERATOR(pg_catalog.=) \$1 AND key OPERATOR(pg_catalog.=) \$2 AND token OPERATOR(pg_catalog.=) \$3 AND status OPERATOR(pg_catalog.=) 'in_progress' AND expires_at OPERATOR(pg_catalog.>) \$7" -c "EXPLAIN EXECUTE c('a', 'b', gen_random_uuid(), 201, NULL, NULL, now())" | grep -o 'Index Scan using [a-z_]*\|Seq Scan\|Bitmap' | head -1)
    echo "$v: the complete's UPDATE runs as: $plan" | tee -a "$OUT/plans.txt"
done
machine_info >"$OUT/machine.txt"

printf 'clients\tscenario\timpl\tround\tlog_prefix\tpgbench_tps\txids\twal_bytes\tstarted\n' >"$OUT/runs.tsv"
for c in $CLIENTS; do
    for r in $(seq 1 "$ROUNDS"); do
        for v in $VARIANTS; do
            DB=v_$v
            name=claim_complete.$v.c$c.r$r
            q -c "$(cleanup_sql "$v")" -c "VACUUM" -c "CHECKPOINT"
            pgbench -h "$CDIR/socket" -p "$PORT" -U postgres -n -M prepared -c "$c" -j $(( c < 2 ? c : 2 )) \
                -T "$SECONDS_PER_RUN" -l --log-prefix="$OUT/logs/$name" \
                -f "$BENCH/scripts/claim_complete.$(impl_of "$v").sql" "$DB" >"$OUT/logs/$name.out" 2>&1
            tps=$(sed -n 's/^tps = \([0-9.]*\) (without.*/\1/p' "$OUT/logs/$name.out")
            printf '%s\t%s\t%s\t%s\t%s\t%s\t0\t0\t0\n' "$c" claim_complete "$v" "$r" "logs/$name" "$tps" >>"$OUT/runs.tsv"
            printf 'c=%-3s round %s %-10s %10s tps\n' "$c" "$r" "$v" "$tps"
        done
    done
done
echo "== summary"
{
    echo "| clients | variant | tps | p50 ms | p99 ms | tps / installed | tps / floor |"
    echo "| ---: | --- | ---: | ---: | ---: | ---: | ---: |"
    for c in $CLIENTS; do
        base=""
        floor=$(awk -F'\t' -v c="$c" '$1 == c && $3 == "floor" {s += $6; n++} END {if (n) printf "%.0f", s / n}' "$OUT/runs.tsv")
        for v in $VARIANTS; do
            logs=()
            for r in $(seq 1 "$ROUNDS"); do logs+=("$OUT/logs/claim_complete.$v.c$c.r$r"); done
            w=$($PY "$BENCH/latency.py" window "${logs[@]}")
            tps=$(awk -F'\t' -v c="$c" -v v="$v" '$1 == c && $3 == v {s += $6; n++} END {printf "%.0f", s / n}' "$OUT/runs.tsv")
            [ -z "$base" ] && base=$tps
            p50=$($PY -c "import json,sys; print(json.loads(sys.argv[1])['p50_ms'])" "$w")
            p99=$($PY -c "import json,sys; print(json.loads(sys.argv[1])['p99_ms'])" "$w")
            echo "| $c | $v | $tps | $p50 | $p99 | $($PY -c "print(f'{$tps / $base:.2f}x')") | $([ -n "$floor" ] && $PY -c "print(f'{$tps / $floor:.2f}x')" || echo —) |"
        done
    done
    echo
    echo "tps: pgbench's, mean of $ROUNDS rounds; p50 / p99 over all rounds' transactions; $ROWS completed records in the table."
    echo
    sed 's/^/    /' "$OUT/plans.txt"
} | tee "$OUT/summary.md"
echo "results: $OUT"
