#!/usr/bin/env bash
# The sending side end to end (tests/sending/README.md): a real receiver (the Python package's
# FastAPI demo app, which de-duplicates with the extension) behind a fault proxy, and each
# client package's send demo program (tests/sending/senders/*.json) as real processes,
# killed with SIGKILL at the points that matter. PostgreSQL 15; ports: tests/lib.sh's
# "sending" row, and its "send-faults" row for the second cluster (the sender's database of
# the scenarios db_faults, which restarts it, and settings).
#   tests/sending/run.sh [LANG...]     default: every language with a sender file
# Last line: "sending: N passed, M failed".
set -uo pipefail
. "$(dirname "$0")/../lib.sh" || exit 2
cd "$ROOT" || exit 2
DIR=$(dir_of sending)
PORT=$(port_of sending)
venv=$ROOT/clients/python/.venv
# The send demos are built with cargo and go, where their installers put them.
export PATH="$PATH:$HOME/.cargo/bin:/usr/local/go/bin"

give_up() { echo "sending: $*" >&2; echo "sending: 0 passed, 1 failed"; exit 1; }

# The receiver and the Python sender run in the Python package's venv (clients/python/test.sh
# makes it; made here the same way when this suite runs alone).
if [ ! -x "$venv/bin/uvicorn" ]; then
    python3 -m venv "$venv" || give_up "python3 -m venv failed"
    "$venv/bin/pip" install -q --disable-pip-version-check -c clients/python/constraints.txt \
        "./clients/python[test]" || give_up "pip install of clients/python[test] failed"
fi
# The package as it is in this tree (the venv may hold an older build of it).
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall ./clients/python ||
    give_up "installing clients/python into its venv failed"
if [ "$IDEM_EDITION" = native ]; then
    extension_installed || give_up "the extension is not installed into PostgreSQL $PG_MAJOR (scripts/test.sh installs it)"
fi

FAULTS_DIR=$(dir_of send-faults)
FAULTS_PORT=$(port_of send-faults)
trap 'cluster_stop "$FAULTS_DIR"; cluster_stop "$DIR"' EXIT
cluster_fresh "$DIR" "$PORT" "$LISTEN_TCP" || give_up "the cluster did not start"
for db in send_sender send_receiver; do
    fresh_database "$db" -h "$DIR/socket" -p "$PORT" -U postgres >/dev/null || give_up "creating $db failed"
done
cluster_fresh "$FAULTS_DIR" "$FAULTS_PORT" "$LISTEN_TCP" || give_up "the send-faults cluster did not start"
fresh_database send_faults -h "$FAULTS_DIR/socket" -p "$FAULTS_PORT" -U postgres >/dev/null ||
    give_up "creating send_faults failed"
"$venv/bin/python" tests/sending/run.py --pg-port "$PORT" --first-port $((PORT + 1)) \
    --faults-pg-port "$FAULTS_PORT" --faults-pg-dir "$FAULTS_DIR" --pg-bin "$PGBIN" "$@"
