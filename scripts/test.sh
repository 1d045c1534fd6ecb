#!/usr/bin/env bash
# The test suites, on a fresh Debian 12 machine as root, on PostgreSQL 15 and 18.
#
#   scripts/test.sh                   everything (what CI runs: .ci/run)
#   scripts/test.sh fast              the quick tier (TIER fast): the checks of the tree, unit +
#                                     in-process, regress, isolation
#   scripts/test.sh SUITE...          those suites (names below)
#   scripts/test.sh --pg 18 ...       on one major only (repeatable; default: 15 and 18)
#
#   scripts/test.sh --list            the suites, one a line: NAME WHERE TIER NEEDS COMMAND DESCRIPTION
#                                     (tab-separated; CONTRIBUTING.md's table is written from it
#                                     by scripts/suite-table.py)
#
# Before a major's suites that need it, the extension is built and installed (release) into
# that major. Each suite's log: target/test-logs/[pgMAJOR/]SUITE.log. Every suite ends with
# "NAME: N passed, M failed"; this script sums them, prints each suite's duration and ends
# with one line "total: N passed, M failed". STRESS_SECONDS=120 for a longer stress run,
# STRESS_SEND_SECONDS=120 for a longer sending phase of it.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
# On a fresh machine PostgreSQL is not there yet (install-deps below brings it): the majors
# are chosen with --pg, and each is checked when its turn comes.
unset PG_MAJOR
. tests/lib.sh 2>/dev/null || true

LOGS=$ROOT/target/test-logs
STARTED=$SECONDS

# --- the suites --------------------------------------------------------------------------

# register NAME WHERE TIER NEEDS DESCRIPTION COMMAND...
#   WHERE  once (not tied to a major, before the majors' suites) | after (once, after every
#          major's suites, when the extension is installed into each) | each (every major) |
#          15 | 18 (that major only)
#   TIER   fast (also in `scripts/test.sh fast`) | full
#   NEEDS  - | ext (the release build installed into the major) | cluster (also the shared
#          test cluster running, in PGHOST/PGPORT)
#   DESCRIPTION  one line: what the suite proves (Markdown; CONTRIBUTING.md's suite table)
#   COMMAND  a script or a function below; OPTIONAL:PATH runs PATH and, while PATH is not in
#          the tree, prints that it is skipped
NAMES=()
declare -A WHERE TIER NEEDS DESCRIPTION COMMAND
register() {
    # A line written before descriptions existed would take its command for one: refuse it.
    if [ $# -lt 6 ] || [[ $5 != *" "* ]]; then
        echo "test.sh: register $1: NAME WHERE TIER NEEDS 'DESCRIPTION' COMMAND... (got: $*)" >&2
        exit 2
    fi
    NAMES+=("$1"); WHERE[$1]=$2; TIER[$1]=$3; NEEDS[$1]=$4; DESCRIPTION[$1]=$5; shift 5
    COMMAND[${NAMES[-1]}]="$*"
}

# The descriptions are Markdown in single quotes: their backticks are meant literally.
# shellcheck disable=SC2016
register_suites() {
    register lint            once full -       '`cargo fmt --check` and clippy, shellcheck, ruff, eslint, the test-hygiene check ([Lints](#lints))' \
        OPTIONAL:scripts/lint.sh
    register links           once fast -       'every relative link and `#anchor` in the Markdown files resolves' \
        OPTIONAL:scripts/check-links.py
    register links-self-test once fast -       'the link checker on a temporary tree of good and broken links' \
        /usr/bin/python3 scripts/check-links.py --self-test
    register contract        once fast -       'docs/reference.md (its generated tables), `src/errors.rs`, `src/settings.rs`, the SQL and every SQLSTATE and problem type in the repository against `contract/contract.json` ([contract/README.md](contract/README.md))' \
        /usr/bin/python3 scripts/check-contract.py
    register contract-self-test once fast -    'the contract checker on the description changed six ways, each caught' \
        /usr/bin/python3 scripts/check-contract.py --self-test
    register suite-table     once fast -       'the suite table of CONTRIBUTING.md says what `scripts/test.sh --list` says' \
        /usr/bin/python3 scripts/suite-table.py --check
    register module-cycles   once fast -       'no two modules of a Rust crate import each other (the self-test on a made-up crate, then each crate)' \
        /usr/bin/python3 scripts/check-module-cycles.py
    register unit            each fast -       'the pure modules (`cargo test --lib`: RFC 8785 on the examples of the RFC, the binary form of jsonb, argument checks, SQLSTATEs, the symbols kept for old releases) and the proptest fuzzing, then the in-process `#[pg_test]`s of the SPI paths (`cargo pgrx test pgN`)' \
        pgrx_tests
    register regress         each fast cluster 'pg_regress: every outcome and every bad input; the expected output reads as documentation (`make -C tests installcheck ISOLATION=`)' \
        installcheck regress
    register isolation       each fast cluster 'isolationtester specs, one per interleaving that matters ([docs/reliability.md](docs/reliability.md#concurrent-sessions); `make -C tests installcheck REGRESS=`)' \
        installcheck isolation
    register regress-spi     each fast cluster 'regress again with every record read through SPI (`idempotency.direct_read = off` in every session, [docs/operations.md](docs/operations.md#read-paths))' \
        through_spi installcheck regress
    register isolation-spi   each fast cluster 'the isolation specs again with every record read through SPI' \
        through_spi installcheck isolation
    register docs-sql        each fast cluster 'every SQL block of README.md and docs/reference.md runs, in order, in a fresh database and prints what the page shows ([Documentation](#documentation))' \
        /usr/bin/python3 tests/docs/run.py
    register pg_cron         each full ext     'a cluster with pg_cron preloaded: `schedule_maintenance()`, then a wait until pg_cron has run the sweep and the release; where Debian ships pg_cron (15)' \
        tests/pg_cron/run.sh
    register upgrade         each full ext     'every past release of both editions (out of git history) installed with live data, then `ALTER EXTENSION UPDATE`, compared object by object with a fresh install ([Adding a release](#adding-a-release))' \
        tests/upgrade/run.sh
    register parity          each full ext     'a fresh native and a fresh portable install, described alike, against each other (the differences on the commented allow-list [`tests/parity/allowed.txt`](tests/parity/allowed.txt)) and against [`contract/contract.json`](contract/contract.json)' \
        tests/parity/run.sh
    register completer       each full cluster 'the dead-worker recovery example, run for real (`examples/completer.py --self-test`)' \
        completer
    register stress          each full ext     '32 sessions, killed backends, one server crash, then 24 senders on 3 targets whose receivers fail: no deadlock ([docs/reliability.md](docs/reliability.md#killed-backends-and-a-crash-the-stress-run); `tests/stress/stress.py`)' \
        stress
    register security        each full ext     'privileges, row-level security, `search_path` hijacks, dump and restore with the `pg_dump` of that major, a hot standby, huge and hostile input ([docs/security.md](docs/security.md))' \
        tests/security/run.sh
    register security-spi    15   full ext     'the security suite again with every record read through SPI' \
        through_spi tests/security/run.sh
    register sqlsmith        15   full ext     'SQLsmith'"'"'s random queries over the extension'"'"'s tables, view and functions, with the records read directly: no backend crashes, the server still answers ([docs/security.md](docs/security.md))' \
        tests/sqlsmith/run.sh
    register stress-spi      15   full ext     'the stress run again with every record read through SPI' \
        through_spi stress
    register security-portable each full -     'the security suite against the portable edition, each of its differences asserted as the portable behaviour ([docs/portable.md](docs/portable.md))' \
        env IDEM_EDITION=portable tests/security/run.sh
    register client-examples each full ext     'the Python, Node and Rust client examples against a real server (the Go one runs in go-client)' \
        tests/clients/run_examples.sh
    register e2e             15   full ext     'the example HTTP service under real faults ([docs/applications.md](docs/applications.md#example-service))' \
        tests/e2e/run.sh
    register citus           each full ext     'a coordinator and two workers, where Citus is installed; skipped with a message otherwise' \
        tests/citus/run.sh
    register pgtle           each full -       'the portable edition through pg_tle, by a `pgtle_admin` member: a fresh install and an update from the previous release, where pg_tle is installed (PGTLE_PGBIN, a PostgreSQL without the native files); skipped with a message otherwise ([docs/portable.md](docs/portable.md#install-with-pg_tle-rds-aurora-supabase))' \
        tests/pgtle/run.sh
    # Suites of the packaging, monitoring, portable-edition and client-package work.
    register meta            once full -       '`META.json` (PGXN) against `Cargo.toml`, the control file and the Debian changelog' \
        tests/package/meta.sh
    register portable-assembly once fast -     'the committed portable release file and `pgtle.sql` are what `scripts/assemble_portable.py` makes of their sources' \
        tests/portable/assembly.sh
    register package         once full -       'the `.deb` for 15 (`dpkg -i` / `-r` on a machine without the extension, lintian, the demo, updates from every release) and the tarball for 18 ([docs/packages.md](docs/packages.md))' \
        tests/package/run.sh
    register release         once full -       '`scripts/release.sh 0.0.0-test` in a scratch copy of the tree: every version string moves, the native install script it freezes is the current SQL, the meta suite there passes, the portable upgrade skeleton installs, the old release'"'"'s files leave the tree for git history (after package, whose release build it reuses)' \
        tests/package/release.sh
    register monitoring      each full ext     'the Prometheus PostgreSQL exporter of Debian scraped with our queries, the alert rules under promtool ([docs/monitoring.md](docs/monitoring.md))' \
        tests/monitoring/run.sh
    register python-client   15   full ext     'the tests of the Python middleware package, over real HTTP, also through PgBouncer' \
        clients/python/test.sh
    register artifacts-python 15  full ext     'the Python package as PyPI will ship it: the wheel and the sdist built (`scripts/build-artifacts.sh python`), the wheel installed into a fresh project outside the clone, the README'"'"'s example apps run against a database restarted, stopped (503 within 2 s) and started again; the sdist installed ([tests/artifacts/python.sh](tests/artifacts/python.sh))' \
        tests/artifacts/python.sh
    register node-client     15   full ext     'the tests of the Node middleware package, over real HTTP, also through PgBouncer' \
        clients/node/test.sh
    register artifacts-node  15   full ext     'the Node package as npm will ship it: the tarball built (`scripts/build-artifacts.sh node`), installed as the README says into a fresh project outside the clone (express from the registry), the README'"'"'s example app run against a database restarted, stopped (503 within 2 s) and started again ([tests/artifacts/node.sh](tests/artifacts/node.sh))' \
        tests/artifacts/node.sh
    register rust-client     15   full ext     'the tests of the Rust middleware crate, over real HTTP, also through PgBouncer' \
        clients/rust/test.sh
    register artifacts-rust  15   full ext     'the Rust crate as crates.io will ship it: the `.crate` built (`scripts/build-artifacts.sh rust`, `cargo package`), unpacked, a fresh crate outside the clone depending on it by path, the README'"'"'s example app built and run against a database restarted, stopped (503 within 2 s) and started again ([tests/artifacts/rust.sh](tests/artifacts/rust.sh))' \
        tests/artifacts/rust.sh
    register go-client       15   full ext     'the tests of the Go package (`go vet`, staticcheck, `go test -race`), over real HTTP, also through PgBouncer, and the Go client example' \
        clients/go/test.sh
    register artifacts-go    15   full ext     'the Go module as the Go module proxy will serve it: `go mod verify`, no `replace`, the module zip made by the go command (`scripts/build-artifacts.sh go`), taken into a fresh project by the README'"'"'s install blocks as written, the README'"'"'s example app built there and run against a database restarted, stopped (503 within 2 s) and started again ([tests/artifacts/go.sh](tests/artifacts/go.sh))' \
        tests/artifacts/go.sh
    register java-client     15   full ext     'the tests of the Java package (core client, Servlet filter, Spring Boot starter; `mvn verify` with the compiler warnings as errors), over real HTTP, also through PgBouncer' \
        clients/java/test.sh
    register artifacts-java  15   full ext     'the Java package as Maven Central will ship it: the README'"'"'s install block run as it is (`scripts/build-artifacts.sh java`: the jars with their sources and javadoc jars and poms; `mvn install:install-file` into a throwaway local repository), fresh projects outside the clone with the README'"'"'s dependencies and its two example apps (Spring Boot, plain Servlet) run against a database restarted, stopped (503 within 2 s) and started again ([tests/artifacts/java.sh](tests/artifacts/java.sh))' \
        tests/artifacts/java.sh
    register e2e-apps        15   full ext     'the black-box HTTP suite (`tests/e2e/run.py`) against the demo app of every client package' \
        e2e_apps
    # After the client packages' suites: bench/http.sh reuses their venv and Rust builds.
    register bench-smoke     15   full ext     'every benchmark script, tiny runs, so they keep working (its figures mean nothing)' \
        bench_smoke
    register claim-retry     each full cluster 'a claim whose reply to COMMIT is lost, repeated with its caller-chosen token (`tests/claim_retry/run.py`)' \
        claim_retry
    # The last suites of a major that mostly wait (on leases, timeouts, a receiver's faults): they
    # run in a lane beside the next major's suites (BESIDE below), after every suite that builds
    # or installs what they share (the venv, node_modules, the Java and Rust builds).
    register sending         15   full ext     'the sending side end to end ([tests/sending/README.md](tests/sending/README.md)): each package'"'"'s send demo program against a real receiver behind a fault proxy, SIGKILLed before, during and after an attempt; 503, 429, 409, dropped answers, 422, 410, give-up, the retry budget, a trickling answer against the timeout, the sender'"'"'s database terminated and restarted under its worker, the per-sender settings (each language the scenarios its senders/LANG.json lists); exactly one side effect per operation' \
        tests/sending/run.sh
    register sending-portable 15  full -       'the sending side end to end against the portable edition (the Python send demo: the packages differ from each other in the client, not in the edition)' \
        env IDEM_EDITION=portable tests/sending/run.sh python
    register migrate         after full ext    'a 15 database moved to 18 by dump and restore ([docs/packages.md](docs/packages.md#moving-a-database-from-15-to-18))' \
        tests/migrate/run.sh
    register portable        after full ext    'the portable edition on 15 and 18: regress, isolation, security, stress, switching editions ([docs/portable.md](docs/portable.md))' \
        tests/portable/run.sh
}

# --list: one line per suite, its fields tab-separated.
list_suites() {
    local n
    for n in "${NAMES[@]}"; do
        printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$n" "${WHERE[$n]}" "${TIER[$n]}" "${NEEDS[$n]}" "${COMMAND[$n]}" "${DESCRIPTION[$n]}"
    done
}

pgrx_tests() {
    local dir
    dir=$(dir_of pgrx-test)
    rm -rf "$dir"
    cargo pgrx test "pg$PG_MAJOR" --runas postgres --pgdata "$dir"
}

installcheck() { # installcheck regress|isolation
    local status
    rm -rf "tests/results/$1"
    if [ "$1" = regress ]; then
        make -C tests installcheck PG_CONFIG="$PGBIN/pg_config" ISOLATION=
    else
        make -C tests installcheck PG_CONFIG="$PGBIN/pg_config" REGRESS=
    fi
    status=$?
    [ $status -ne 0 ] && find "tests/results/$1" -name '*.diffs' -exec cat {} + | head -200
    return $status
}

completer() {
    psql -X -q -c "DROP DATABASE IF EXISTS completer_test" -c "CREATE DATABASE completer_test" postgres &&
        /usr/bin/python3 examples/completer.py --self-test --host "$PGHOST" --port "$PGPORT" --dbname completer_test
}

# COMMAND with idempotency.direct_read = off in every session it opens (libpq's PGOPTIONS,
# also passed on to the servers' clients that the suites start): the SPI read path.
through_spi() {
    PGOPTIONS="${PGOPTIONS:-} -c idempotency.direct_read=off" "$@"
}

# The stress run crashes its server once, so it gets a cluster of its own.
stress() {
    local dir port status
    dir=$(dir_of stress)
    port=$(port_of stress)
    cluster_fresh "$dir" "$port" || return 1
    /usr/bin/python3 tests/stress/stress.py --host "$dir/socket" --port "$port" --datadir "$dir/data" \
        --bindir "$PGBIN" --seconds "${STRESS_SECONDS:-20}" --sessions 32 --keys 300 \
        --send-seconds "${STRESS_SEND_SECONDS:-8}" --senders 24
    status=$?
    cluster_stop "$dir"
    return $status
}

# The black-box HTTP suite against every client package's demo app (after the packages' own
# suites, which set up their runtimes).
e2e_apps() { E2E_APPS_PORT=$(port_of e2e-apps) tests/e2e/run_demo_apps.sh; }

# A claim whose COMMIT's reply is lost, repeated with its caller-chosen token.
claim_retry() {
    /usr/bin/python3 tests/claim_retry/run.py --host "$PGHOST" --port "$PGPORT" --proxy-port "$(port_of claim-retry)"
}

# The benchmark scripts, smoke-tested so they keep working (figures of a smoke run mean nothing).
# Each step once, tiny, and its time (the suite's budget is two minutes).
bench_smoke() {
    local passed=0 failed=0 step t0
    for step in "/usr/bin/python3 -m unittest discover -s bench" "bench/run.sh --smoke --pg $PG_MAJOR" \
        "bench/issues-34-35.sh --smoke --only run-fsync-on,simulate" "bench/send.sh --smoke" "bench/http.sh --smoke"; do
        t0=$SECONDS
        if $step; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL $step"; fi
        echo "bench-smoke: $step took $((SECONDS - t0)) s"
    done
    echo "bench-smoke: $passed passed, $failed failed"
    [ "$failed" -eq 0 ]
}

# --- arguments ---------------------------------------------------------------------------

usage() {
    sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    echo "Suites (WHERE TIER NEEDS NAME):"
    local n
    for n in "${NAMES[@]}"; do printf '  %-6s %-4s %-7s %s\n' "${WHERE[$n]}" "${TIER[$n]}" "${NEEDS[$n]}" "$n"; done
}
register_suites
majors=()
wanted=()
while [ $# -gt 0 ]; do
    case $1 in
    --pg)
        pg_bindir "${2:-}" >/dev/null || { echo "test.sh: --pg needs one of: $PG_MAJORS" >&2; exit 2; }
        majors+=("$2"); shift 2 ;;
    fast)
        for n in "${NAMES[@]}"; do [ "${TIER[$n]}" = fast ] && wanted+=("$n"); done
        shift ;;
    -h|--help) usage; exit 0 ;;
    --list) list_suites; exit 0 ;;
    in-process|unit-and-in-process) wanted+=(unit); shift ;;
    client_examples|examples) wanted+=(client-examples); shift ;;
    *)
        if [ -z "${WHERE[$1]+x}" ]; then
            echo "test.sh: unknown suite '$1'; suites: fast ${NAMES[*]}" >&2
            exit 2
        fi
        wanted+=("$1"); shift ;;
    esac
done
[ ${#majors[@]} -eq 0 ] && read -r -a majors <<<"$PG_MAJORS"
[ ${#wanted[@]} -eq 0 ] && wanted=("${NAMES[@]}")
is_wanted() { local w; for w in "${wanted[@]}"; do [ "$w" = "$1" ] && return 0; done; return 1; }

# --- counting ----------------------------------------------------------------------------

total_passed=0
total_failed=0
broken=()
declare -A DURATION   # "SUITE|MAJOR" (MAJOR empty for suites not tied to one) -> seconds

# Adds a suite's counts from its log. Three summary forms are understood:
#   cargo:       "test result: ok. 42 passed; 0 failed; ..."   (every such line counts)
#   pg_regress:  "All 9 tests passed."  or  "2 of 9 tests failed."  (pg 15),
#                "# All 9 tests passed." or "# 2 of 9 tests failed." (pg 18, TAP output)
#   our own:     "stress: 5 passed, 0 failed"   (the last such line is the suite's whole total)
count() { # count LABEL LOG STATUS SECONDS
    local label=$1 log=$2 status=$3 p=0 f=0 own=0 own_p=0 own_f=0 line
    while read -r line; do
        if [[ $line =~ test\ result:\ [a-zA-Z]+\.\ ([0-9]+)\ passed\;\ ([0-9]+)\ failed ]]; then
            p=$((p + BASH_REMATCH[1])); f=$((f + BASH_REMATCH[2]))
        elif [[ $line =~ ^(#\ )?All\ ([0-9]+)\ tests\ passed ]]; then
            p=$((p + BASH_REMATCH[2]))
        elif [[ $line =~ ^(#\ )?([0-9]+)\ of\ ([0-9]+)\ tests\ failed ]]; then
            p=$((p + BASH_REMATCH[3] - BASH_REMATCH[2])); f=$((f + BASH_REMATCH[2]))
        elif [[ $line =~ ^[a-z0-9_-]+:\ ([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
            own=1; own_p=${BASH_REMATCH[1]}; own_f=${BASH_REMATCH[2]}
        fi
    done < "$log"
    # A suite's own closing line is its total: cargo or pg_regress lines it printed on the way
    # are already in it.
    if [ "$own" = 1 ]; then p=$own_p; f=$own_f; fi
    # A suite that failed without saying how many counts as one failure.
    if [ "$status" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    total_passed=$((total_passed + p))
    total_failed=$((total_failed + f))
    [ "$status" -ne 0 ] && broken+=("$label (log: $log)")
    echo "== $label: $p passed, $f failed ($4 s)"
}

run() { # run NAME [MAJOR]: in the major lib.sh's use_major chose
    local name=$1 major=${2:-} cmd status t0 log logdir=$LOGS suffix=""
    [ -n "$major" ] && { logdir=$LOGS/pg$major; suffix=" (pg$major)"; }
    read -r -a cmd <<<"${COMMAND[$name]}"
    mkdir -p "$logdir"
    log=$logdir/$name.log
    echo "== $name$suffix"
    if [[ ${cmd[0]} == OPTIONAL:* ]]; then
        cmd[0]=${cmd[0]#OPTIONAL:}
        if [ ! -e "${cmd[0]}" ]; then
            echo "$name: skipped: ${cmd[0]} not in this tree yet"
            return
        fi
    fi
    t0=$SECONDS
    "${cmd[@]}" 2>&1 | tee "$log"
    status=${PIPESTATUS[0]}
    DURATION[$name|$major]=$((SECONDS - t0))
    count "$name$suffix" "$log" "$status" "$((SECONDS - t0))"
}

# Suites that mostly wait (on leases, timeouts, a receiver's faults) and use no shared test
# cluster: registered last in their major, they run one after the other in a lane beside the
# next major's suites and the after-suites, their output shown when the lane ends. The suites
# before them have built and installed what they share (the venv, node_modules, Java, Rust).
BESIDE=(sending sending-portable)
is_beside() { local b; for b in "${BESIDE[@]}"; do [ "$b" = "$1" ] && return 0; done; return 1; }
LANE_PID=""
# The lane's counts come back through a file, not its subshell's variables.
# shellcheck disable=SC2030,SC2031
lane_start() { # lane_start MAJOR NAME...: the suites run in the background, counted at lane_join
    LANE_MAJOR=$1; shift
    LANE_NAMES=("$@")
    LANE_OUT=$LOGS/pg$LANE_MAJOR/lane.out
    echo "== in a lane beside what follows: ${LANE_NAMES[*]} (pg$LANE_MAJOR; output when it ends)"
    (
        total_passed=0 total_failed=0 broken=()
        for name in "${LANE_NAMES[@]}"; do run "$name" "$LANE_MAJOR"; done >"$LANE_OUT" 2>&1
        {
            echo "$total_passed $total_failed"
            for name in "${LANE_NAMES[@]}"; do echo "${DURATION[$name|$LANE_MAJOR]:-0}"; done
            printf '%s\n' "${broken[@]}"
        } >"$LANE_OUT.counts"
    ) &
    LANE_PID=$!
}
# shellcheck disable=SC2031
lane_join() {
    [ -n "$LANE_PID" ] || return 0
    local t0=$SECONDS p f name took line
    wait "$LANE_PID"
    LANE_PID=""
    echo
    echo "==== the lane (pg$LANE_MAJOR: ${LANE_NAMES[*]}), waited for $((SECONDS - t0)) s"
    cat "$LANE_OUT"
    if [ ! -s "$LANE_OUT.counts" ]; then
        total_failed=$((total_failed + 1)); broken+=("the lane ${LANE_NAMES[*]} (pg$LANE_MAJOR) ended without its counts")
        return
    fi
    {
        read -r p f
        total_passed=$((total_passed + p)); total_failed=$((total_failed + f))
        for name in "${LANE_NAMES[@]}"; do read -r took; DURATION[$name|$LANE_MAJOR]=$took; done
        while read -r line; do [ -n "$line" ] && broken+=("$line"); done
    } <"$LANE_OUT.counts"
}

not_here() { # not_here NAME SUFFIX WHY: a suite that does not run on this major, said aloud
    echo "== $1$2: not run: $3"
}

# --- preparing a major -------------------------------------------------------------------

# The release build installed into PG_MAJOR (once per major and run).
declare -A INSTALLED
install_extension_build() {
    [ -n "${INSTALLED[$PG_MAJOR]:-}" ] && return "${INSTALLED[$PG_MAJOR]}"
    # IDEM_SKIP_INSTALL=1: a second checkout's run uses the build already installed.
    if [ -n "${IDEM_SKIP_INSTALL:-}" ] && extension_installed; then
        echo "== install (pg$PG_MAJOR): skipped (IDEM_SKIP_INSTALL), the installed build is used"
        INSTALLED[$PG_MAJOR]=0
        return 0
    fi
    local t0=$SECONDS log=$LOGS/pg$PG_MAJOR/install.log
    mkdir -p "$LOGS/pg$PG_MAJOR"
    echo "== building and installing the extension (release) into PostgreSQL $PG_MAJOR"
    if cargo pgrx install --release --pg-config "$PGBIN/pg_config" \
            --no-default-features --features "pg$PG_MAJOR" >"$log" 2>&1; then
        INSTALLED[$PG_MAJOR]=0
    else
        tail -n 40 "$log"
        INSTALLED[$PG_MAJOR]=1
        total_failed=$((total_failed + 1))
        broken+=("install (pg$PG_MAJOR) (log: $log)")
    fi
    DURATION[install|$PG_MAJOR]=$((SECONDS - t0))
    echo "== install (pg$PG_MAJOR): $((SECONDS - t0)) s"
    return "${INSTALLED[$PG_MAJOR]}"
}

# The shared test cluster of PG_MAJOR (regress, isolation, completer), started on first use.
TEST_CLUSTER=""
test_cluster() {
    [ "$TEST_CLUSTER" = "$PG_MAJOR" ] && return 0
    local dir port
    dir=$(dir_of test)
    port=$(port_of test)
    cluster_fresh "$dir" "$port" || return 1
    TEST_CLUSTER=$PG_MAJOR
    export PGHOST=$dir/socket PGPORT=$port PGUSER=postgres
}
stop_test_cluster() {
    [ -n "$TEST_CLUSTER" ] && cluster_stop "$(dir_of test "$TEST_CLUSTER")"
    TEST_CLUSTER=""
}
stop_lane() { [ -n "$LANE_PID" ] && kill "$LANE_PID" 2>/dev/null && wait "$LANE_PID"; }
trap 'stop_lane; stop_test_cluster' EXIT

# --- the run -----------------------------------------------------------------------------

scripts/install-deps.sh || { echo "install-deps failed"; echo "total: 0 passed, 1 failed"; exit 1; }
export PATH="$HOME/.cargo/bin:$PATH"
mkdir -p "$LOGS"
rm -rf "$LOGS"/*.log "$LOGS"/pg*/

for name in "${NAMES[@]}"; do
    is_wanted "$name" && [ "${WHERE[$name]}" = once ] && run "$name"
done
after=()

for major in "${majors[@]}"; do
    use_major "$major" || { total_failed=$((total_failed + 1)); broken+=("PostgreSQL $major"); continue; }
    echo
    echo "==== PostgreSQL $PG_MAJOR ($PGBIN)"
    lane=()
    for name in "${NAMES[@]}"; do
        is_wanted "$name" || continue
        case ${WHERE[$name]} in
        once) continue ;;
        after)
            # The extension installed into every major first, when the suite needs it.
            [ "${NEEDS[$name]}" = ext ] && install_extension_build
            [ "$major" = "${majors[-1]}" ] && after+=("$name")
            continue ;;
        each) ;;
        "$PG_MAJOR") ;;
        *) not_here "$name" " (pg$PG_MAJOR)" "it runs on PostgreSQL ${WHERE[$name]} only"; continue ;;
        esac
        case ${NEEDS[$name]} in
        ext|cluster)
            if ! install_extension_build; then
                not_here "$name" " (pg$PG_MAJOR)" "the extension did not build or install (counted once, as install)"
                continue
            fi ;;
        esac
        if [ "${NEEDS[$name]}" = cluster ] && ! test_cluster; then
            total_failed=$((total_failed + 1)); broken+=("$name (pg$PG_MAJOR): the test cluster did not start")
            continue
        fi
        if is_beside "$name"; then lane+=("$name"); else run "$name" "$PG_MAJOR"; fi
    done
    stop_test_cluster
    # A lane goes on through the next majors and the after-suites, until another one starts.
    if [ ${#lane[@]} -gt 0 ]; then lane_join; lane_start "$PG_MAJOR" "${lane[@]}"; fi
done
[ ${#after[@]} -gt 0 ] && { echo; echo "==== after every major"; use_major "${majors[0]}"; }
for name in "${after[@]}"; do
    run "$name"
done
lane_join

echo
printf '%-18s %6s' "duration (s)" "once"
for major in "${majors[@]}"; do printf ' %6s' "pg$major"; done
echo
for name in install "${NAMES[@]}"; do
    row=$(printf '%-18s %6s' "$name" "${DURATION[$name|]:-}")
    took=${DURATION[$name|]:-}
    for major in "${majors[@]}"; do
        row+=$(printf ' %6s' "${DURATION[$name|$major]:-}")
        took+=${DURATION[$name|$major]:-}
    done
    [ -n "$took" ] && echo "$row"
done
echo "wall clock: $((SECONDS - STARTED)) s"
if [ ${#broken[@]} -gt 0 ]; then
    printf 'failed suite: %s\n' "${broken[@]}"
fi
echo "total: $total_passed passed, $total_failed failed"
[ "$total_failed" -eq 0 ]
