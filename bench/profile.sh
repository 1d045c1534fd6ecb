#!/usr/bin/env bash
# Where the time goes: instruction counts of the claim paths under valgrind's callgrind, on a
# single backend (postgres --single, the cluster stopped), for the extension, the PL/pgSQL
# peer and the raw floor. Instruction counts do not depend on what else the machine runs, so
# these figures are the same on a busy machine and a quiet one.
#
#   bench/profile.sh [--calls N] [--paths "replay in_progress claim_complete seen_dup fp_64k"]
#                    [--variant installed|v010|noexpidx|hot|pkonly] [--port P] [--dir DIR]
#                    [--out DIR] [--smoke]
#   --variant: idempotency.keys changed as bench/variants.sh describes (lib.sh variant_sql)
#   --impls "ext peer floor": which implementations to run
#
# For each path and implementation it runs a script of N operations twice, with N and 2N,
# and reports (cost of 2N - cost of N) / N: the cost of one more operation, without the
# start-up (loading the library, preparing the plans, filling the caches). Every operation
# is one `EXECUTE` of a prepared statement between BEGIN and COMMIT, as with pgbench
# -M prepared. Then, for the extension, the inclusive cost of the functions that matter
# (callgrind_annotate --inclusive=yes) from the 2N run.
#
# Writes OUT (default bench/results/profile-<UTC time>): per-run callgrind.out files,
# annotate listings, and summary.md (printed at the end).
# perf works here too (software event cpu-clock only: this VM has no hardware counters):
#   perf record -e cpu-clock -g -p <backend pid>, while pgbench runs one client.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

CALLS=2000
PATHS="replay in_progress claim_complete seen_dup fp_1k fp_64k"
PORT=$(( $(port_of bench) + 2 ))   # tests/lib.sh: bench ports
CDIR=/tmp/idempotency-profile-$PORT
OUT=""
SMOKE=0
VARIANT=installed
IMPLS="ext peer floor"
while [ $# -gt 0 ]; do
    case $1 in
        --calls) CALLS=$2; shift 2 ;;
        --paths) PATHS=$2; shift 2 ;;
        --port) PORT=$2; CDIR=/tmp/idempotency-profile-$PORT; shift 2 ;;
        --dir) CDIR=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --smoke) SMOKE=1; CALLS=50; shift ;;
        --variant) VARIANT=$2; shift 2 ;;
        --impls) IMPLS=$2; shift 2 ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "profile.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
command -v valgrind >/dev/null || { echo "profile.sh needs valgrind (apt-get install valgrind)" >&2; exit 1; }
OUT=${OUT:-$BENCH/results/profile-$(date -u +%Y%m%dT%H%M%SZ)$(if [ "$SMOKE" = 1 ]; then echo -smoke; fi)}
mkdir -p "$OUT"
chmod 777 "$OUT"   # the postgres OS user writes the callgrind files
trap 'cluster_stop "$CDIR"; rm -rf "$CDIR"' EXIT

echo "== cluster $CDIR; results in $OUT"
cluster_fresh "$CDIR" "$PORT" "shared_buffers = 256MB"
admin -c "CREATE DATABASE bench"
DB=bench
q -f "$BENCH/plpgsql_peer.sql" >/dev/null 2>&1
q -v nkeys=10000 -f "$BENCH/setup.sql" >/dev/null
sql=$(variant_sql "$VARIANT"); [ -n "$sql" ] && q -c "$sql" && q -c "ANALYZE"
machine_info >"$OUT/machine.txt"
cluster_stop "$CDIR"

S="'acct_42 POST /charges'"
FP="'sha256:4f2d'"
BODY="'{\"id\": \"ch_1\", \"amount\": 500, \"currency\": \"usd\"}'::jsonb"
HDRS="'{\"Location\": \"/charges/ch_1\"}'::jsonb"

# prepare PATH IMPL: the PREPARE line(s); op PATH IMPL I: the statements of operation I.
prepare() {
    case $1.$2 in
        replay.ext|in_progress.ext) echo "PREPARE q(text) AS SELECT * FROM idempotency.idem_claim($S, \$1, $FP);" ;;
        replay.peer|in_progress.peer) echo "PREPARE q(text) AS SELECT * FROM peer.claim($S, \$1, $FP);" ;;
        replay.floor|in_progress.floor)
            echo "PREPARE i(text) AS INSERT INTO idempotency_keys (key, fingerprint, status, expires_at) VALUES (\$1, $FP, 'in_progress', now() + interval '24 hours') ON CONFLICT (key) DO NOTHING RETURNING id;"
            echo "PREPARE q(text) AS SELECT status, fingerprint, response FROM idempotency_keys WHERE key = \$1;" ;;
        claim_complete.ext) echo "PREPARE q(text) AS SELECT idempotency.idem_complete($S, \$1, (idempotency.idem_claim($S, \$1, $FP)).token, 201, $BODY, $HDRS);" ;;
        claim_complete.peer) echo "PREPARE q(text) AS SELECT peer.complete($S, \$1, (peer.claim($S, \$1, $FP)).token, 201, $BODY, $HDRS);" ;;
        claim_complete.floor)
            echo "PREPARE i(text) AS INSERT INTO idempotency_keys (key, fingerprint, status, expires_at) VALUES (\$1, $FP, 'in_progress', now() + interval '24 hours') ON CONFLICT (key) DO NOTHING RETURNING id;"
            echo "PREPARE q(text) AS UPDATE idempotency_keys SET status = 'completed', response = '{\"status\": 201, \"headers\": {\"Location\": \"/charges/ch_1\"}, \"body\": {\"id\": \"ch_1\", \"amount\": 500, \"currency\": \"usd\"}}' WHERE key = \$1;" ;;
        seen_dup.ext) echo "PREPARE q(text) AS SELECT idempotency.idem_seen('orders-consumer', \$1);" ;;
        seen_dup.peer) echo "PREPARE q(text) AS SELECT peer.seen('orders-consumer', \$1);" ;;
        seen_dup.floor) echo "PREPARE q(text) AS INSERT INTO processed_messages (scope, message_id, expires_at) VALUES ('orders-consumer', \$1, now() + interval '24 hours') ON CONFLICT DO NOTHING;" ;;
        fp_1k.ext|fp_64k.ext) echo "PREPARE q(int) AS SELECT idempotency.idem_fingerprint(doc) FROM bench_docs WHERE id = \$1;" ;;
        fp_1k.peer|fp_64k.peer) echo "PREPARE q(int) AS SELECT peer.fingerprint(doc) FROM bench_docs WHERE id = \$1;" ;;
        *) return 1 ;;
    esac
}
arg() {  # the argument of operation I of PATH
    case $1 in
        replay) echo "'r-$(( $2 % 10000 + 1 ))'" ;;
        in_progress) echo "'p-$(( $2 % 10000 + 1 ))'" ;;
        claim_complete) echo "'prof-$3-$2'" ;;
        seen_dup) echo "'s-$(( $2 % 10000 + 1 ))'" ;;
        fp_1k) echo "$(( $2 % 8 + 1 ))" ;;
        fp_64k) echo "$(( $2 % 8 + 101 ))" ;;
    esac
}
script() {  # script PATH IMPL N TAG
    local path=$1 impl=$2 n=$3 tag=$4 i a
    prepare "$path" "$impl"
    for ((i = 1; i <= n; i++)); do
        a=$(arg "$path" "$i" "$tag")
        echo "BEGIN;"
        if [[ $impl == floor && ( $path == replay || $path == in_progress || $path == claim_complete ) ]]; then
            echo "EXECUTE i($a);"
        fi
        echo "EXECUTE q($a);"
        echo "COMMIT;"
    done
}
# total instructions of a callgrind output file
total_ir() { sed -n 's/^summary: \([0-9]*\).*/\1/p; s/^totals: \([0-9]*\).*/\1/p' "$1" | head -1; }

run_cg() {  # run_cg FILE SCRIPTFILE
    runuser -u postgres -- valgrind --tool=callgrind --callgrind-out-file="$1" \
        --separate-threads=no \
        "$PGBIN/postgres" --single -D "$CDIR/data" -c shared_buffers=256MB bench <"$2" >/dev/null 2>"$1.log"
}

{
    echo "### Instructions per operation (callgrind; (cost of 2N - cost of N) / N, N = $CALLS; idempotency.keys: $VARIANT)"
    echo
    echo "| path | extension | PL/pgSQL peer | raw SQL floor | extension / peer (lower is better) | extension / floor |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: |"
} >"$OUT/summary.md"
n2=$((CALLS * 2))
for path in $PATHS; do
    declare -A per=()
    for impl in $IMPLS; do
        prepare "$path" "$impl" >/dev/null 2>&1 || continue
        echo "== $path $impl"
        script "$path" "$impl" "$CALLS" "a$impl" >"$OUT/$path.$impl.n1.sql"
        script "$path" "$impl" "$n2" "b$impl" >"$OUT/$path.$impl.n2.sql"
        run_cg "$OUT/$path.$impl.n1.cg" "$OUT/$path.$impl.n1.sql"
        run_cg "$OUT/$path.$impl.n2.cg" "$OUT/$path.$impl.n2.sql"
        a=$(total_ir "$OUT/$path.$impl.n1.cg"); b=$(total_ir "$OUT/$path.$impl.n2.cg")
        per[$impl]=$(( (b - a) / CALLS ))
        callgrind_annotate --inclusive=yes --threshold=99.5 "$OUT/$path.$impl.n2.cg" 2>/dev/null \
            | head -120 >"$OUT/$path.$impl.inclusive.txt" || true
        callgrind_annotate --threshold=95 "$OUT/$path.$impl.n2.cg" 2>/dev/null \
            | head -80 >"$OUT/$path.$impl.self.txt" || true
        rm -f "$OUT/$path.$impl.n1.sql" "$OUT/$path.$impl.n2.sql"
    done
    ratio() { [ -n "${per[$2]:-}" ] && $PY -c "print(f'{${per[$1]} / ${per[$2]}:.2f}x')" || echo "—"; }
    echo "| $path | ${per[ext]:-—} | ${per[peer]:-—} | ${per[floor]:-—} | $(ratio ext peer) | $(ratio ext floor) |" >>"$OUT/summary.md"
    unset per
done
echo >>"$OUT/summary.md"
# The breakdown of the extension's paths.
ext_files=()
for p in $PATHS; do ext_files+=("$OUT/$p.ext"); done
$PY "$BENCH/cg_breakdown.py" "$CALLS" "${ext_files[@]}" >>"$OUT/summary.md"
echo "== summary"
cat "$OUT/summary.md"
echo "results: $OUT (callgrind_annotate --inclusive=yes FILE.n2.cg for the breakdown)"
