#!/usr/bin/env bash
# End-to-end tests of the example service: builds examples/charges-api (release, its own
# Cargo.lock, target dir inside the project) and runs tests/e2e/run.py against the binary.
# Needs the extension installed into the system PostgreSQL 15 (scripts/setup.sh does it).
# Extra arguments go to run.py (--port, --timeout, --keep-logs). Last line:
#   e2e: N passed, M failed
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
project="$root/examples/charges-api"
cargo build --release --locked --manifest-path "$project/Cargo.toml" --target-dir "$project/target"
# The service's own unit tests (the Idempotency-Key parser); reuses the release build.
cargo test --release --locked --quiet --manifest-path "$project/Cargo.toml" --target-dir "$project/target"
exec /usr/bin/python3 "$root/tests/e2e/run.py" --service-bin "$project/target/release/charges-api" "$@"
