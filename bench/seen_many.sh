#!/usr/bin/env bash
# idem_seen_many against 100 idem_seen calls and against the hand-written floor, with
# batches of 100 message ids, for new ids and for duplicates (issue 15, goal: >= 10x the
# messages/s of 100 idem_seen calls, >= 1.0x the floor). Runs pgbench -n -M prepared on an
# already running server with the extension installed (PGHOST / PGPORT / PGUSER from the
# environment), in a database of its own that it creates afresh. The implementations
# alternate within each round, so a busy machine's drift falls on all of them alike.
# bench/run.sh runs it as its scenario "seen_many", on its own cluster.
#
#   bench/seen_many.sh [--seconds S | --transactions N] [--clients C] [--rounds R] [--batch N]
#                      [--ndup N] [--out DIR]
#   (--transactions N: each run N transactions per client instead of S seconds; bench/run.sh's
#   smoke run uses it)
#
#   many    SELECT idempotency.idem_seen_many(scope, ARRAY[...N ids])  (one transaction)
#   each    N x SELECT idempotency.idem_seen(scope, id), each its own transaction, as a
#           consumer that handles one message at a time calls it (N round trips, N commits)
#   single  BEGIN; N x SELECT idempotency.idem_seen(scope, id); COMMIT  (N round trips, one
#           commit: the cheapest way to make the N calls)
#   floor   INSERT INTO idempotency.messages SELECT scope, unnest(ARRAY[...]), now(), now() + ttl
#           ON CONFLICT DO NOTHING RETURNING message_id  (does less: no expiry, no booleans)
# New ids: every transaction draws a random 62-bit prefix. Duplicates: NDUP ids (default
# 100,000) recorded first, each transaction picks N consecutive ones at random.
# Prints a table with messages/s (median of the rounds) and the ratios; writes the pgbench
# outputs, runs.tsv and summary.md to $OUT (default /tmp/idem-seen-many-bench).
set -euo pipefail
SECONDS_PER_RUN=10
CLIENTS=2
ROUNDS=3
BATCH=100
NDUP=100000
TRANSACTIONS=""
OUT=${OUT:-/tmp/idem-seen-many-bench}
DB=idem_bench_seen_many
while [ $# -gt 0 ]; do
    case $1 in
        --seconds) SECONDS_PER_RUN=$2; shift 2 ;;
        --transactions) TRANSACTIONS=$2; shift 2 ;;
        --clients) CLIENTS=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --batch) BATCH=$2; shift 2 ;;
        --ndup) NDUP=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
rm -rf "$OUT"; mkdir -p "$OUT/scripts"
psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB"
q() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$DB" "$@"; }
q -c "CREATE EXTENSION idempotency"
IMPLS="many each single floor"
# Duplicates: NDUP recorded ids per implementation's scope.
for impl in $IMPLS; do
    q -c "INSERT INTO idempotency.messages SELECT 'dup-$impl', 'm' || g, now(), now() + interval '1 day'
          FROM generate_series(1, $NDUP) g"
done
q -c "VACUUM ANALYZE idempotency.messages"

ids() { # ids PREFIX_EXPR: an ARRAY[...] of BATCH ids
    local i out="ARRAY["
    for ((i = 1; i <= BATCH; i++)); do
        out+="$1 || '$i'"
        [ "$i" -lt "$BATCH" ] && out+=", "
    done
    echo "$out]"
}
for case_ in new dup; do
    if [ "$case_" = new ]; then
        set_line='\set r random(1, 4611686018427387903)'
        prefix="'n' || :r || '-'"
        single_id() { echo "'n' || :r || '-$1'"; }
    else
        set_line="\\set s random(0, $((NDUP - BATCH)))"
        prefix="'m' || (:s + 0)::text"
        single_id() { echo "'m' || (:s + $1)::text"; }
    fi
    # Duplicates: ids m(s+1) .. m(s+BATCH) as text; new ids: n<r>-1 .. n<r>-BATCH.
    if [ "$case_" = dup ]; then
        arr="ARRAY(SELECT 'm' || (:s + g) FROM generate_series(1, $BATCH) g)"
    else
        arr=$(ids "$prefix")
    fi
    scope_many="'$case_-many'"; scope_floor="'$case_-floor'"; scope_single="'$case_-single'"; scope_each="'$case_-each'"
    { echo "$set_line"; echo "SELECT idempotency.idem_seen_many($scope_many, $arr);"; } >"$OUT/scripts/$case_.many.sql"
    { echo "$set_line"
      echo "INSERT INTO idempotency.messages (scope, message_id, seen_at, expires_at)"
      echo "  SELECT $scope_floor, id, now(), now() + interval '1 day' FROM unnest($arr) AS id"
      echo "  ON CONFLICT DO NOTHING RETURNING message_id;"; } >"$OUT/scripts/$case_.floor.sql"
    { echo "$set_line"; echo "BEGIN;"
      for ((i = 1; i <= BATCH; i++)); do echo "SELECT idempotency.idem_seen($scope_single, $(single_id "$i"));"; done
      echo "COMMIT;"; } >"$OUT/scripts/$case_.single.sql"
    { echo "$set_line"
      for ((i = 1; i <= BATCH; i++)); do echo "SELECT idempotency.idem_seen($scope_each, $(single_id "$i"));"; done
    } >"$OUT/scripts/$case_.each.sql"
done

printf 'case\timpl\tround\ttps\tmessages_per_s\n' >"$OUT/runs.tsv"
length=(-T "$SECONDS_PER_RUN"); per_run="$SECONDS_PER_RUN s"
[ -n "$TRANSACTIONS" ] && length=(-t "$TRANSACTIONS") && per_run="$TRANSACTIONS transactions per client"
for ((round = 1; round <= ROUNDS; round++)); do
    for case_ in new dup; do
        for impl in $IMPLS; do
            pgbench -n -M prepared -c "$CLIENTS" -j "$CLIENTS" "${length[@]}" \
                -f "$OUT/scripts/$case_.$impl.sql" "$DB" >"$OUT/$case_.$impl.$round.txt" 2>&1
            tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$OUT/$case_.$impl.$round.txt" | head -1)
            printf '%s\t%s\t%s\t%s\t%s\n' "$case_" "$impl" "$round" "$tps" \
                "$(awk -v t="$tps" -v b="$BATCH" 'BEGIN { printf "%.0f", t * b }')" >>"$OUT/runs.tsv"
        done
    done
done
python3 - "$OUT/runs.tsv" "$BATCH" "$CLIENTS" "$per_run" "$ROUNDS" <<'PY' | tee "$OUT/summary.md"
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
med = {}
for c in ("new", "dup"):
    for i in ("many", "each", "single", "floor"):
        med[c, i] = statistics.median(float(r["messages_per_s"]) for r in rows if r["case"] == c and r["impl"] == i)
n = sys.argv[2]
print(f"batch {n}, {sys.argv[3]} clients, {sys.argv[4]} per run, {sys.argv[5]} rounds (medians, messages/s)")
print()
print(f"| ids | idem_seen_many | {n} x idem_seen, a transaction each | {n} x idem_seen in one transaction | floor |"
      f" many / each | many / one transaction | floor / one transaction | many / floor |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for c in ("new", "dup"):
    m, e, s, f = (med[c, i] for i in ("many", "each", "single", "floor"))
    print(f"| {c} | {m:,.0f} | {e:,.0f} | {s:,.0f} | {f:,.0f} | {m / e:.1f}x | {m / s:.1f}x | {f / s:.1f}x | {m / f:.2f}x |")
PY
psql -X -q -d postgres -c "DROP DATABASE $DB"
