#!/usr/bin/env bash
# The sending side against the outbox teams write by hand (issue 23's figures; bench/send.py
# says what each implementation does). One throwaway cluster (tests/lib.sh's "send-bench" row:
# PostgreSQL on +0, the receiver on +1), two databases (the native extension; the portable
# edition), the Python package's venv (made as tests/sending/run.sh makes it; the package
# itself is read from the checkout).
#
#   bench/send.sh [--sends N] [--senders "1 16"] [--rounds R] [--latency-sends N] [--rate R]
#                 [--out DIR] [--smoke]
#
#   --sends N          due sends per throughput run (default 4000)
#   --senders LIST     sender processes (default "1 16"); the budget's cost is measured at the
#                      largest count
#   --rounds R         rounds of alternation (default 3); medians are reported
#   --latency-sends N  business transactions per delay run (default 300), at --rate per second
#                      (default 50)
#   --smoke            what CI runs (bench-smoke): tiny runs; checks the script, not the speed
#
# Writes OUT (default bench/results/send-<UTC time>): runs.tsv, summary.md, machine.txt.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

ARGS=()
OUT=""
while [ $# -gt 0 ]; do
    case $1 in
        --sends|--senders|--rounds|--latency-sends|--rate) ARGS+=("$1" "$2"); shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --smoke) ARGS+=(--sends 40 --senders "1 2" --rounds 1 --latency-sends 10 --rate 100); shift ;;
        *) echo "bench/send.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
OUT=${OUT:-$BENCH/results/send-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
PORT=$(port_of send-bench)
CDIR=$(dir_of send-bench)
DB=bench_send
venv=$ROOT/clients/python/.venv

extension_installed || { echo "bench/send.sh: the extension is not installed into PostgreSQL $PG_MAJOR" >&2; exit 2; }
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import pg_idempotency.sender' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check -c "$ROOT/clients/python/constraints.txt" \
        "$ROOT/clients/python[test]"
fi

trap 'cluster_stop "$CDIR"; rm -rf "$CDIR"' EXIT
cluster_fresh "$CDIR" "$PORT" "$LISTEN_TCP"
fresh_database "$DB" -h "$CDIR/socket" -p "$PORT" -U postgres
IDEM_EDITION=portable fresh_database "${DB}_portable" -h "$CDIR/socket" -p "$PORT" -U postgres
machine_info | tee "$OUT/machine.txt"
url() { echo "postgresql://postgres@127.0.0.1:$PORT/$1"; }
# The checkout's package first (the venv gives its dependencies).
PYTHONPATH=$ROOT/clients/python/src "$venv/bin/python" "$BENCH/send.py" --dsn "$(url "$DB")" --dsn-portable "$(url "${DB}_portable")" \
    --port $((PORT + 1)) --out "$OUT" "${ARGS[@]}"
echo "results: $OUT"
