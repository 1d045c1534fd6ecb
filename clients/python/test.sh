#!/usr/bin/env bash
# The Python package's suite, on a fresh Debian 12 machine as root:
#   1. a venv (clients/python/.venv, or $IDEM_PY_VENV) with the
#      pinned packages of constraints.txt; the package built (python -m build) and its wheel
#      installed into the venv with the test extras
#   2. a throwaway PostgreSQL 15 cluster with the extension, and PgBouncer (transaction
#      pooling) in front of it
#   3. pytest: the client and the fingerprint against the real extension, the FastAPI
#      (uvicorn) and Django (gunicorn) demo apps as real servers over real HTTP, directly and
#      through PgBouncer; FastAPI apps writing with SQLAlchemy sessions (tests/test_sqlalchemy.py);
#      a second cluster restarted, stopped and started under the README's example apps, a Django
#      app and the demo apps (tests/test_outage.py), and under the sender's worker (tests/test_sender_faults.py); README.md's install block run as it is in a
#      fresh venv (from PyPI, pinned through PIP_CONSTRAINT; IDEM_PY_SKIP_README=1 skips it) and
#      README's first app against the database
# Last line: "python-client: N passed, M failed" (from pytest's junit report; skipped tests are
# listed with their reason and not counted as passed). Exit code non-zero on any failure.
#   IDEM_PY_PORT (default: tests/lib.sh's "python" port; PgBouncer on +1), IDEM_PY_DIR,
#   IDEM_PY_HTTP_PORT (first port for the demo servers; default: tests/lib.sh's "python-apps" row)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../tests/lib.sh" || exit 2

port=${IDEM_PY_PORT:-$(port_of python)}
bouncer_port=$((port + 1))
dir=${IDEM_PY_DIR:-$(dir_of python)}
venv=${IDEM_PY_VENV:-$here/.venv}

give_up() {
    echo "python-client: $*" >&2
    echo "python-client: 0 passed, 1 failed"
    exit 1
}

echo "== venv $venv"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" || give_up "python3 -m venv failed"
fi
py=$venv/bin/python
stamp=$venv/.constraints.sha
want=$(sha256sum "$here/constraints.txt" "$here/pyproject.toml" | sha256sum | cut -c1-64)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    "$py" -m pip install -q --disable-pip-version-check -c "$here/constraints.txt" build hatchling \
        || give_up "pip install (build tools) failed"
fi
echo "== python -m build (into $dir.dist, out of the source tree)"
rm -rf "$dir.dist"
"$py" -m build --no-isolation --outdir "$dir.dist" "$here" >"$dir.build.log" 2>&1 ||
    { cat "$dir.build.log"; give_up "python -m build failed"; }
wheel=$(ls "$dir.dist"/pg_idempotency-*.whl)
"$py" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$wheel" || give_up "installing the wheel failed"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    "$py" -m pip install -q --disable-pip-version-check -c "$here/constraints.txt" "${wheel}[test]" \
        || give_up "pip install (test extras) failed"
    echo "$want" >"$stamp"
fi

if ! extension_installed; then
    echo "== the extension is not installed into PostgreSQL $PG_MAJOR: cargo pgrx install --release"
    (cd "$ROOT" && cargo pgrx install --release --pg-config "$(pg_config_for "$PG_MAJOR")" >"$dir.install.log" 2>&1) ||
        { tail -20 "$dir.install.log"; give_up "the extension could not be installed (scripts/install-deps.sh first)"; }
fi

cleanup() {
    pgbouncer_stop "$dir/bouncer"
    cluster_stop "$dir/outage"
    cluster_stop "$dir"
}
trap cleanup EXIT
echo "== PostgreSQL $PG_MAJOR on port $port, PgBouncer on $bouncer_port ($dir)"
cluster_stop "$dir/outage"  # one a run that was killed left behind
cluster_fresh "$dir" "$port" "$LISTEN_TCP" || give_up "the cluster did not start"
pgbouncer_start "$dir/bouncer" "$bouncer_port" "$port" "prep_check = host=127.0.0.1 port=$port dbname=idem_py" ||
    give_up "pgbouncer did not start"
echo "== $("$PGBOUNCER" --version | head -1), pool_mode = transaction"
# A second cluster, on its unix socket only, that tests/test_outage.py restarts, stops and starts
# again under running apps (the database unavailable, then back).
cluster_start "$dir/outage" "$port" "listen_addresses = ''" || give_up "the outage cluster did not start"
export IDEM_PY_OUTAGE_DIR="$dir/outage" IDEM_PY_PGBIN="$PGBIN"
export IDEM_PY_OUTAGE_URL="postgresql://postgres@/postgres?host=$dir/outage/socket&port=$port"

export IDEM_PY_DATABASE_URL="postgresql://postgres@127.0.0.1:$port/postgres"
export IDEM_PY_PGBOUNCER_URL="postgresql://postgres@127.0.0.1:$bouncer_port/postgres"
export IDEM_PY_HTTP_PORT=${IDEM_PY_HTTP_PORT:-$(port_of python-apps)}
export IDEM_PY_LOG_DIR="$dir/logs"
mkdir -p "$IDEM_PY_LOG_DIR"
echo "== pytest"
(cd "$here" && "$py" -m pytest -p no:cacheprovider -rs -q --junitxml="$dir/junit.xml" tests)
rc=$?
read -r total fails errors skips < <("$py" - "$dir/junit.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
t = f = e = s = 0
for suite in ET.parse(sys.argv[1]).getroot().iter("testsuite"):
    t += int(suite.get("tests", 0)); f += int(suite.get("failures", 0))
    e += int(suite.get("errors", 0)); s += int(suite.get("skipped", 0))
print(t, f, e, s)
PY
) || give_up "no pytest report (exit code $rc)"
passed=$((total - fails - errors - skips))
failed=$((fails + errors))
[ "$rc" -ne 0 ] && [ "$failed" -eq 0 ] && failed=1
[ "$skips" -gt 0 ] && echo "($skips skipped, each with its reason above; not counted as passed)"
echo "python-client: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
