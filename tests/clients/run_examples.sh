#!/usr/bin/env bash
# Runs the client examples in examples/clients/ (Python, Node, Rust) against a throwaway
# PostgreSQL cluster of PG_MAJOR (15 or 18) with the extension. The Go example is run by
# clients/go/test.sh (the go-client suite). Needs the extension installed into that PostgreSQL,
# /usr/bin/python3 with psycopg 3, node + npm, cargo; npm ci and cargo fetch from their registries.
#   tests/clients/run_examples.sh [PORT]      (default: tests/lib.sh's "examples" port)
# Last line: "examples: N passed, M failed"; the exit code is non-zero if anything failed.
set -uo pipefail
. "$(dirname "$0")/../lib.sh" || exit 2
root=$ROOT
port=${1:-${EXAMPLES_PORT:-$(port_of examples)}}
dir=$(dir_of examples)
ex="$root/examples/clients"

cleanup() {
    cluster_stop "$dir"
    rm -rf "$dir"
}
trap cleanup EXIT

# tally LANG LOG RC: adds the "LANG: N passed, M failed" line of LOG; a missing line or a
# non-zero exit code without failures counts as one failure.
tally() {
    local lang=$1 log=$2 rc=$3 line p f
    line=$(grep -E "^$lang: [0-9]+ passed, [0-9]+ failed$" "$log" | tail -1)
    if [ -z "$line" ]; then
        fail "$lang" "no result line (exit code $rc)"
        return
    fi
    p=$(sed -E 's/.*: ([0-9]+) passed.*/\1/' <<<"$line")
    f=$(sed -E 's/.*, ([0-9]+) failed/\1/' <<<"$line")
    if [ "$rc" != 0 ] && [ "$f" = 0 ]; then
        echo "FAIL $lang: exit code $rc"
        f=1
    fi
    passed=$((passed + p))
    failed=$((failed + f))
}

# Build first, so the cluster is not kept waiting.
echo "== node: npm ci"
if ! (cd "$ex/node" && timeout 600 npm ci --no-audit --no-fund); then
    fail "node: npm ci"
    node_ok=0
else
    node_ok=1
fi
echo "== rust: cargo build"
if ! timeout 900 cargo build --locked --quiet --manifest-path "$ex/rust/Cargo.toml" --target-dir "$ex/rust/target"; then
    fail "rust: cargo build"
    rust_ok=0
else
    rust_ok=1
fi

cluster_fresh "$dir" "$port" "$LISTEN_TCP" || { fail "start PostgreSQL $PG_MAJOR"; finish examples; exit 1; }
install_extension postgres -h "$dir/socket" -p "$port" -U postgres ||
    { fail "install the extension"; finish examples; exit 1; }
export DATABASE_URL="postgresql://postgres@127.0.0.1:$port/postgres"
log=$(mktemp)

echo "== python"
timeout 120 /usr/bin/python3 "$ex/python/example.py" 2>&1 | tee "$log"
tally python "$log" "${PIPESTATUS[0]}"

if [ "$node_ok" = 1 ]; then
    echo "== node"
    (cd "$ex/node" && timeout 120 node example.js) 2>&1 | tee "$log"
    tally node "$log" "${PIPESTATUS[0]}"
fi

if [ "$rust_ok" = 1 ]; then
    echo "== rust"
    timeout 120 "$ex/rust/target/debug/idempotency-example-rust" 2>&1 | tee "$log"
    tally rust "$log" "${PIPESTATUS[0]}"
fi
rm -f "$log"

finish examples
