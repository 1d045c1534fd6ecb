#!/usr/bin/env bash
# Installs what building and testing the extension needs on Debian 12, as root, and skips
# whatever is already there: PostgreSQL 15 with its server headers, pg_cron and pgTAP,
# clang for pgrx's bindings, sudo for `cargo pgrx test --runas`, psycopg 3 for the client
# tests (Debian's, used with /usr/bin/python3), and cargo-pgrx 0.18.0.
set -euo pipefail

PGRX_VERSION=0.18.0
PACKAGES=(
    postgresql-15 postgresql-server-dev-15 postgresql-15-cron postgresql-15-pgtap
    clang libclang-dev sudo pkg-config libssl-dev make python3-psycopg
)

missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "install-deps: installing ${missing[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# The Debian package starts a cluster of its own on port 5432; ours run on private ports,
# so it is left alone.

export PATH="$HOME/.cargo/bin:$PATH"
if [ "$(cargo pgrx --version 2>/dev/null)" != "cargo-pgrx $PGRX_VERSION" ]; then
    echo "install-deps: installing cargo-pgrx $PGRX_VERSION (a few minutes)"
    cargo install cargo-pgrx --version "$PGRX_VERSION" --locked
fi

PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config
if ! grep -qs "^pg15 = \"$PG_CONFIG\"" "${PGRX_HOME:-$HOME/.pgrx}/config.toml"; then
    cargo pgrx init --pg15="$PG_CONFIG"
fi
