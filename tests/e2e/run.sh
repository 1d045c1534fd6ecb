#!/usr/bin/env bash
# End-to-end tests of the example service: builds examples/charges-api (debug, its own
# Cargo.lock, the target dir it shares with clients/rust: target/clients) and runs
# tests/e2e/run.py against the binary. Needs the extension installed into the system
# PostgreSQL 15 (scripts/setup.sh does it). Its four ports: tests/lib.sh's "e2e" row. Extra
# arguments go to run.py (--port, --timeout, --keep-logs). To test another demo app instead: tests/e2e/run.py --app-cmd "..." (see run.py).
# Last line:
#   e2e: N passed, M failed
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/tests/lib.sh"
project="$root/examples/charges-api"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target/clients}
cargo build --locked --manifest-path "$project/Cargo.toml"
exec /usr/bin/python3 "$root/tests/e2e/run.py" --service-bin "$CARGO_TARGET_DIR/debug/charges-api" \
    --port "$(port_of e2e)" "$@"
