#!/usr/bin/env bash
# The previous release's library against the current tree's, side by side in one run:
#   old  the release --old (default 0.4.1), built from the commit that holds its install script
#        (the one sql/releases/past.tsv names, scripts/past-releases.sh), taken out with git archive
#   new  the extension as this tree's src/ and sql/ stand (uncommitted changes included)
# Each is installed into a COPY of PostgreSQL 18 (bench/lib.sh's copy_build: the system's
# installations stay untouched), and runs its own cluster with the same settings
# and the same data (bench/setup.sql). Then the ext scripts of bench/scripts, with
# pgbench -n -M prepared -l, alternate between the two clusters: old new in odd rounds, new old
# in even ones, for each client count and scenario. summary.md: the median tps of the rounds per
# release, new/old, the range of the per-round new/old ratios (the noise), p50 and p99.
#
#   bench/releases.sh [--old VERSION] [--seconds S] [--clients "2 16"] [--rounds R]
#                     [--scenarios "a b"] [--nkeys N] [--conf 'name = value']... [--out DIR]
#                     [--keep] [--no-build]
#
#   --old VERSION   the earlier release (default 0.4.1)
#   --seconds S     pgbench -T per run (default 10)
#   --clients LIST  client counts (default "2 16"); pgbench threads: 2 at most
#   --rounds R      rounds (default 4; even, so each release goes first as often)
#   --scenarios     default: replay in_progress mismatch seen_dup seen_new claim_complete
#   --nkeys N       pre-populated records (bench/setup.sql; default 100000)
#   --conf LINE     an extra postgresql.conf line for both clusters (repeatable)
#   --keep          leave both clusters running afterwards
#   --no-build      use the builds already installed into the copies (after an earlier run)
#
# Folder: bench/lib.sh's COPIES (tests/lib.sh's dir_of bench-releases 18): the copies pg-VERSION
# and pg-tree, their cargo target directories, the build logs, the old source (src-VERSION) and
# the clusters (cluster-old, cluster-new). Ports: tests/lib.sh's bench-releases row (+0 old,
# +1 new). Results in --out (default bench/results/releases-<UTC time>): runs.tsv, the pgbench
# logs, machine.txt, summary.md / summary.tsv.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

OLD=0.4.1
SECONDS_PER_RUN=10
CLIENTS="2 16"
ROUNDS=4
NKEYS=100000
SCENARIOS="replay in_progress mismatch seen_dup seen_new claim_complete"
OUT=""
KEEP=0
BUILD=1
CONF=("shared_buffers = 512MB" "max_wal_size = 4GB" "checkpoint_timeout = 30min")
while [ $# -gt 0 ]; do
    case $1 in
        --old) OLD=$2; shift 2 ;;
        --seconds) SECONDS_PER_RUN=$2; shift 2 ;;
        --clients) CLIENTS=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --scenarios) SCENARIOS=$2; shift 2 ;;
        --nkeys) NKEYS=$2; shift 2 ;;
        --conf) CONF+=("$2"); shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --keep) KEEP=1; shift ;;
        --no-build) BUILD=0; shift ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "releases.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
for s in $SCENARIOS; do
    [ -f "$BENCH/scripts/$s.ext.sql" ] || { echo "releases.sh: --scenarios: no script bench/scripts/$s.ext.sql" >&2; exit 2; }
done

use_major 18 || exit 2
NEW=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/Cargo.toml" | head -n 1)
OLD_REF=$("$ROOT/scripts/past-releases.sh" commit "$OLD") || exit 2
BASE_PORT=$(port_of bench-releases 18)
declare -A PORTS=([old]=$BASE_PORT [new]=$((BASE_PORT + 1)))
declare -A COPY=([old]=$OLD [new]=tree)
OUT=${OUT:-$BENCH/results/releases-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$COPIES" "$OUT/logs"
DB=bench

copy_of() { copy_prefix "${COPY[$1]}"; }
# on_side SIDE: PGBIN, PORT and CDIR (for q, cluster_*) are that release's.
on_side() { PGBIN=$(copy_of "$1")/bin; PORT=${PORTS[$1]}; CDIR=$COPIES/cluster-$1; }

cleanup() {
    if [ "$KEEP" = 0 ]; then
        for side in old new; do
            on_side "$side"
            cluster_stop "$CDIR"
            rm -rf "$CDIR"
        done
    fi
}
trap cleanup EXIT

if [ "$BUILD" = 1 ]; then
    old_src=$(release_source "$OLD")
    copy_build "$OLD" "$old_src"
    copy_build tree "$ROOT"
else
    copy_make "$OLD"
    copy_make tree
fi
# The old build's install script should be the frozen one; say so either way.
if cmp -s <("$ROOT/scripts/past-releases.sh" show "$OLD" native) "$(copy_of old)/share/extension/idempotency--$OLD.sql"; then
    old_script="identical to the frozen one"
else
    old_script="different from the frozen one (scripts/past-releases.sh show $OLD native; diff them)"
fi
echo "== the install script of the old build is $old_script"
so_sum() { sha256sum "$(copy_of "$1")/lib/idempotency.so" | cut -c1-16; }
[ "$(so_sum old)" != "$(so_sum new)" ] || {
    echo "releases.sh: the two copies hold the same idempotency.so ($(so_sum old)): nothing to compare" >&2; exit 1; }

: >"$OUT/machine.txt"
for side in old new; do
    on_side "$side"
    echo "== $side: cluster $CDIR on port $PORT"
    cluster_fresh "$CDIR" "$PORT" "${CONF[@]}"
    admin -c "CREATE DATABASE $DB"
    q -f "$BENCH/plpgsql_peer.sql" >/dev/null 2>&1
    echo "== $side: populating ($NKEYS records per outcome)"
    q -v nkeys="$NKEYS" -f "$BENCH/setup.sql" >"$OUT/setup-$side.log"
    version=$(q -c "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")
    want=$([ "$side" = old ] && echo "$OLD" || echo "$NEW")
    [ "$version" = "$want" ] || { echo "releases.sh: $side cluster has idempotency $version, not $want" >&2; exit 1; }
    {
        echo "## $side: idempotency $version"
        machine_info
        [ "$side" = old ] && echo "source:      $OLD_REF (sql/releases/past.tsv's commit of $OLD); its install script is $old_script"
        [ "$side" = new ] && echo "source:      $ROOT at $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- src sql Cargo.toml 2>/dev/null || echo ' + uncommitted changes in src/, sql/ or Cargo.toml')"
        echo
    } | tee -a "$OUT/machine.txt"
done

printf 'clients\tscenario\trelease\tround\tlog_prefix\tpgbench_tps\tversion\n' >"$OUT/runs.tsv"
for c in $CLIENTS; do
    threads=$(( c < 2 ? c : 2 ))
    for s in $SCENARIOS; do
        for r in $(seq 1 "$ROUNDS"); do
            order="old new"
            [ $((r % 2)) = 0 ] && order="new old"
            for side in $order; do
                on_side "$side"
                name=$s.$side.c$c.r$r
                version=$([ "$side" = old ] && echo "$OLD" || echo "$NEW")
                q -c "CHECKPOINT"
                "$PGBIN/pgbench" -h "$CDIR/socket" -p "$PORT" -U postgres -n -M prepared -c "$c" -j "$threads" \
                    -T "$SECONDS_PER_RUN" -D nkeys="$NKEYS" -l --log-prefix="$OUT/logs/$name" \
                    -f "$BENCH/scripts/$s.ext.sql" "$DB" >"$OUT/logs/$name.out" 2>&1 || {
                    echo "pgbench failed for $name:"; cat "$OUT/logs/$name.out"; exit 1; }
                tps=$(sed -n 's/^tps = \([0-9.]*\) (without.*/\1/p' "$OUT/logs/$name.out")
                printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$c" "$s" "$side" "$r" "logs/$name" "$tps" "$version" >>"$OUT/runs.tsv"
                printf '%-16s %-3s %-6s c=%-3s round %s: %10s tps\n' "$s" "$side" "$version" "$c" "$r" "$tps"
            done
        done
    done
done

echo "== summary"
$PY "$BENCH/latency.py" releases "$OUT"
echo "results: $OUT"
