#!/usr/bin/env bash
# BENCHMARKS.md's section "Release 0.6.0: one write per request and expiry by partition (issues
# 34, 35)" in one command: every run its tables come from, then each run's summary.md,
# machine.txt and figures/*.svg copied to bench/figures/0.6.0/NAME/ (committed; BENCHMARKS.md
# shows them):
#   run-fsync-off  bench/run.sh, claim_complete and partitions: ext, ext_deferred, ext_committed,
#                  floor, limit, p1, p3 at 2 and 16 clients, --rounds rounds (10 s each), and the
#                  writes per request with warm pages
#   run-fsync-on   the same with --conf 'fsync = on'
#   simulate       bench/simulate.sh: 0.5.0 (built from its commit into a copy of PostgreSQL 18)
#                  against this build, 1 + 3 simulated days; a period of 10 million records
#                  dropped, 1 million expired records deleted
# About 90 minutes on two cores. Results (logs and all) in bench/results/issues-34-35-<UTC time>/.
#
#   bench/issues-34-35.sh [--rounds R] [--only "run-fsync-off run-fsync-on simulate"] [--smoke]
#   (--only: the runs, separated by spaces or commas)
#
#   --smoke  what CI runs (bench-smoke): each run with --smoke, the copies into the results
#            folder instead of bench/figures; checks the script, not the figures
set -euo pipefail
. "$(dirname "$0")/lib.sh"

ROUNDS=3
ONLY="run-fsync-off run-fsync-on simulate"
SMOKE=()
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) ROUNDS=$2; shift 2 ;;
        --only) ONLY=$2; shift 2 ;;
        --smoke) SMOKE=(--smoke); shift ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "issues-34-35.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
RESULTS=$BENCH/results/issues-34-35-$(date -u +%Y%m%dT%H%M%SZ)
FIGURES=$BENCH/figures/0.6.0
[ ${#SMOKE[@]} = 0 ] || { RESULTS+=-smoke; FIGURES=$RESULTS/figures-0.6.0; }
RUN=(--scenarios "claim_complete partitions" --impls "ext ext_deferred ext_committed floor limit p1 p3"
     --clients "2 16" --rounds "$ROUNDS" "${SMOKE[@]}")

keep() { # keep NAME: the run's summary, machine and pictures into bench/figures/0.6.0/NAME
    rm -rf "${FIGURES:?}/$1"
    mkdir -p "$FIGURES/$1"
    cp "$RESULTS/$1/summary.md" "$RESULTS/$1/machine.txt" "$FIGURES/$1/"
    cp "$RESULTS/$1"/figures/*.svg "$FIGURES/$1/"
    echo "== $1: $FIGURES/$1"
}
for name in ${ONLY//,/ }; do
    echo "== $name (load: $(cut -d' ' -f1-3 /proc/loadavg))"
    case $name in
        run-fsync-off) "$BENCH/run.sh" "${RUN[@]}" --out "$RESULTS/$name" ;;
        run-fsync-on) "$BENCH/run.sh" "${RUN[@]}" --conf 'fsync = on' --out "$RESULTS/$name" ;;
        simulate) "$BENCH/simulate.sh" "${SMOKE[@]}" --out "$RESULTS/$name" ;;
        *) echo "issues-34-35.sh: --only: unknown run '$name'" >&2; exit 2 ;;
    esac
    keep "$name"
done
echo "results: $RESULTS"
