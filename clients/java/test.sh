#!/usr/bin/env bash
# The Java package's suite: starts a throwaway PostgreSQL 15 cluster with the extension
# (tests/lib.sh) and Debian's pgbouncer in transaction-pooling mode in front of it, then runs
# `mvn verify` (Maven fetches the dependencies from Maven Central itself): the JUnit 5 tests of
# every module (core, servlet, spring-boot-starter, demo) against both, over real HTTP, and packages
# the demo app (demo/target/idempotency-demo.jar, which tests/e2e/run_demo_apps.sh runs).
#
# Ports and folder: tests/lib.sh's "java" row (PostgreSQL, pgbouncer = +1) and its folder; the
# HTTP servers of the tests listen from its "java-apps" row (JAVA_APPS_PORT). The tests that
# stop and start the server use $JAVA_PG_CTL (below).
# Last line: "java-client: N passed, M failed" (Surefire's own counts; skipped tests are listed
# and not counted as passed).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../tests/lib.sh"
pg_port=${JAVA_SUITE_PORT:-$(port_of java)}
bouncer_port=$((pg_port + 1))
dir=${JAVA_SUITE_DIR:-$(dir_of java)}
export JAVA_APPS_PORT=${JAVA_APPS_PORT:-$(port_of java-apps)}

for tool in java mvn; do
    if ! command -v "$tool" >/dev/null; then
        echo "java-client: $tool is not installed (scripts/install-deps.sh installs OpenJDK 17 and Maven)"
        echo "java-client: 0 passed, 1 failed"
        exit 1
    fi
done

if [ "$IDEM_EDITION" = native ] && ! extension_installed; then
    echo "== the extension is not installed in PostgreSQL $PG_MAJOR: building and installing it (cargo pgrx install)"
    (cd "$ROOT" && PATH="$HOME/.cargo/bin:$PATH" cargo pgrx install --release --pg-config "$PGBIN/pg_config")
fi

# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
    pgbouncer_stop "$dir"
    cluster_stop "$dir/pg"
}
trap cleanup EXIT
cluster_stop "$dir/pg"
rm -rf "$dir"
mkdir -p "$dir"

echo "== PostgreSQL $PG_MAJOR on port $pg_port, pgbouncer (transaction pooling) on port $bouncer_port"
cluster_start "$dir/pg" "$pg_port" "$LISTEN_TCP"
install_extension postgres -h "$dir/pg/socket" -p "$pg_port" -U postgres
pgbouncer_start "$dir" "$bouncer_port" "$pg_port"
# The tests that stop, start and restart the server under a running app or sender (its clients
# reconnect; nothing else runs meanwhile: Maven runs the modules, and Surefire their test
# classes, one at a time) call this script with pg_ctl's command: stop -m fast, start, restart.
cat >"$dir/pg_ctl" <<EOF
#!/usr/bin/env bash
cd / || exit 2
[ "\$(id -u)" = 0 ] && set -- runuser -u postgres -- "$PGBIN/pg_ctl" "\$@" || set -- "$PGBIN/pg_ctl" "\$@"
exec "\$@" -D "$dir/pg/data" -l "$dir/pg/server.log" -w >/dev/null
EOF
chmod +x "$dir/pg_ctl"
export JAVA_PG_CTL=$dir/pg_ctl

echo "== mvn verify (clients/java)"
status=0
cd "$here"

DATABASE_URL="postgresql://postgres@127.0.0.1:$pg_port/postgres" \
PGBOUNCER_URL="postgresql://postgres@127.0.0.1:$bouncer_port/postgres" \
    mvn -B -q -ntp clean verify >"$dir/mvn.log" 2>&1 || status=$?
# Maven 3.8 prints colour resets even in batch mode, without a newline: drop them.
sed 's/\x1b\[[0-9;]*m//g' "$dir/mvn.log"

# Surefire's counts, summed over every module's reports; skipped tests are listed with the reason.
read -r tests failures errors skipped < <(/usr/bin/python3 - ./*/target/surefire-reports/TEST-*.xml <<'PY'
import sys, xml.etree.ElementTree as ET
totals = [0, 0, 0, 0]
for path in sys.argv[1:]:
    try:
        suite = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        continue
    for i, name in enumerate(("tests", "failures", "errors", "skipped")):
        totals[i] += int(suite.get(name, "0"))
    for case in suite.iter("testcase"):
        s = case.find("skipped")
        if s is not None:
            print(f"skipped: {case.get('classname')}.{case.get('name')}: {s.get('message') or ''}", file=sys.stderr)
print(*totals)
PY
)
passed=$((tests - failures - errors - skipped))
failed=$((failures + errors))
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi
[ "$skipped" -gt 0 ] && echo "($skipped tests skipped)"
echo "java-client: $passed passed, $failed failed"
exit $(( status != 0 || failed != 0 ))
