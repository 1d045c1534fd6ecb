#!/usr/bin/env bash
# Tests that leave the machine alone: fails, naming file and line, when a test script
#   - names /proc/sys or sysctl (a change to the host's kernel settings), or
#   - names a TCP port as a literal number instead of taking it from the one port table,
#     tests/lib.sh's PORT_TABLE (port_of NAME): "127.0.0.1:NNNN", "port=NNNN", "--port NNNN",
#     "${X_PORT:-NNNN}", "default=NNNN" / "?? NNNN" / "unwrap_or(NNNN)" after a port's name.
# Test scripts: what scripts/test.sh runs (tests/, bench/, the client packages' test.sh and
# tests, scripts/test.sh and setup.sh, .ci/). Numbers of 1000 and above count as ports.
#   scripts/check-test-hygiene.sh              check the tree (its git-tracked files)
#   scripts/check-test-hygiene.sh --self-test  the patterns against lines they must and must
#                                              not catch
# Exits non-zero on a finding.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

SCOPE=(tests bench scripts/test.sh scripts/setup.sh .ci 'clients/*/test.sh' 'clients/*/test/*' 'clients/*/tests/*'
    ':!tests/lib.sh' ':!bench/figures')
HOST_CHANGE='/proc/sys|\bsysctl\b'
NUM='(?<![\w.])[1-9]\d{3,4}\b'
NAME='(?<![a-z])(?:port|ports|port_base)(?![a-z_])' # port, pg_port, E2E_PORT, DEMO_PORT_BASE; not PORT_SEED
PORT_LITERAL="(?:127\.0\.0\.1|localhost|\[::1\]|0\.0\.0\.0):$NUM"
PORT_LITERAL+="|${NAME}[\"'\])]*\s*(?:=|:=|:|:-|\?\?|\|\||,)?\s*[\"'(]*\s*(?:default:?\s*)?$NUM"
PORT_LITERAL+="|$NAME.{0,80}?(?:default=|unwrap_or\(|\?\?\s*|:-|get\([^)]*,\s*[\"']?)$NUM"

# shellcheck disable=SC2016 # the sample lines are shell text, $ and all
if [ "${1:-}" = --self-test ]; then
    bad=0 checks=0
    expect() { # expect found|clean LINE
        local got=clean
        checks=$((checks + 1))
        printf '%s\n' "$2" | grep -qiP "$PORT_LITERAL|$HOST_CHANGE" && got=found
        [ "$got" = "$1" ] || { echo "FAIL expected $1, got $got: $2"; bad=1; }
    }
    expect found 'port=${E2E_APPS_PORT:-55490}'
    expect found '    ap.add_argument("--proxy-port", type=int, default=56620)'
    expect found '    ap.add_argument("--port", type=int, default=int(os.environ.get("E2E_PORT", "55446")),'
    expect found 'const firstPort = Number(process.env.DEMO_PORT_BASE ?? 20371) + 5 * fileIndex;'
    expect found '    let base: u16 = std::env::var("TEST_PORT_BASE").ok().and_then(|p| p.parse().ok()).unwrap_or(20332);'
    expect found 'export DATABASE_URL="postgresql://postgres@127.0.0.1:20310/postgres"'
    expect found 'psql -h "$dir/socket" --port 20301 -c "SELECT 1"'
    expect found '# Ports: E2E_APPS_PORT (default 55490) to +3.'
    expect found 'echo "port = 5432" >>postgresql.conf'
    expect found 'sysctl -w net.ipv4.ip_local_reserved_ports=20300-21599'
    expect found 'echo 20300-21599 >/proc/sys/net/ipv4/ip_local_reserved_ports'
    expect clean 'port=$(port_of e2e-apps)'
    expect clean 'export DATABASE_URL="postgresql://postgres@127.0.0.1:$port/postgres"'
    expect clean "      const r = await request(port, 'GET', '/healthz', { timeout: 2000 });"
    expect clean 'python3 "$HERE/json_corpus.py" "${PORT_CORPUS:-5000}" "${PORT_SEED:-8785}"'
    expect clean "    const lost = postCharge(app.port, route, { tenant, key: quoted(key), headers: { 'X-Fault-Delay-Ms': '60000' } })"
    expect clean "export LEASE_MS = 1500;"
    echo "check-test-hygiene self-test: $checks lines, $([ $bad = 0 ] && echo "each as expected" || echo FAILED)"
    exit $bad
fi

status=0
if git grep -nP "$HOST_CHANGE" -- "${SCOPE[@]}"; then
    echo "FAIL: a test script above names /proc/sys or sysctl: tests change nothing outside their own folders"
    status=1
fi
if git grep -niP "$PORT_LITERAL" -- "${SCOPE[@]}"; then
    echo "FAIL: a test script above names a port literally: take it from tests/lib.sh's PORT_TABLE (port_of NAME)"
    status=1
fi
[ $status = 0 ] && echo "check-test-hygiene: no /proc/sys or sysctl, no port literal outside tests/lib.sh's table"
exit $status
