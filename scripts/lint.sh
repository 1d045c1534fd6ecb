#!/usr/bin/env bash
# The lint gates CI runs on the Rust crates: `cargo fmt --check` and
# `cargo clippy --all-targets -- -D warnings`, for each crate in CRATES. The extension is
# linted as the unit tests build it and as the in-process tests build it (feature pg_test).
#   scripts/lint.sh            all checks
# Last line: "lint: N passed, M failed" (one per check); exits non-zero on a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

# Each entry: a Cargo.toml, then the feature sets its clippy runs with, separated by ';'
# ("default": the crate's default features; else a comma-separated list of features).
# A new crate is one more line here, e.g.  "examples/charges-api/Cargo.toml;default"
CRATES=(
    "Cargo.toml;default;pg_test"
    "clients/rust/Cargo.toml;default"
    "examples/charges-api/Cargo.toml;default"
)
# The client crate and the example service share one target folder (as their tests build them).
CLIENTS_TARGET=$PWD/target/clients

passed=0
failed=0
check() { # check NAME COMMAND...
    local name=$1
    shift
    echo "== $name: $*"
    if "$@"; then
        passed=$((passed + 1))
        echo "ok   $name"
    else
        failed=$((failed + 1))
        echo "FAIL $name"
    fi
}

for entry in "${CRATES[@]}"; do
    IFS=';' read -r -a parts <<<"$entry"
    manifest=${parts[0]}
    target=()
    [ "$manifest" = Cargo.toml ] || target=(env CARGO_TARGET_DIR="$CLIENTS_TARGET")
    check "fmt $manifest" cargo fmt --manifest-path "$manifest" --check
    for features in "${parts[@]:1}"; do
        flags=()
        [ "$features" = default ] || flags=(--features "$features")
        check "clippy $manifest ($features)" \
            "${target[@]}" cargo clippy --locked --manifest-path "$manifest" --all-targets "${flags[@]}" -- -D warnings
    done
done

echo "lint: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
