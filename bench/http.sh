#!/usr/bin/env bash
# An endpoint with the middleware against the same endpoint without it, per framework (issue
# 24's goal: fresh keys >= 0.6x the plain endpoint's requests per second and p50 <= 1.6x,
# replays >= 1.0x). Per framework two apps of bench/http/FRAMEWORK that differ only in the
# middleware (MIDDLEWARE=on|off: same pool size, same POST /charges inserting one row, same
# answer), on one throwaway cluster (tests/lib.sh's "http-bench" row: PostgreSQL on +0, the
# apps on +1 ...), one database per framework. Debian's wrk drives them (bench/http/wrk.lua):
#   plain   the app without the middleware (sent the same keyed requests, which it ignores)
#   fresh   the app with it, a new Idempotency-Key per request
#   replay  the app with it, a fixed set of keys completed beforehand: every request a replay
# Each round runs every framework's three scenarios, their order turning from round to round;
# medians over the rounds are reported, and the ratios against plain.
#
#   bench/http.sh [--frameworks "fastapi express axum go"] [--duration S] [--connections C]
#                 [--threads T] [--rounds R] [--pool N] [--keys N] [--conf LINE] [--out DIR] [--smoke]
#
#   --frameworks LIST  of fastapi (uvicorn, one process), express (Node, one process), axum
#                      (release build), go (net/http); default all four
#   --duration S       seconds per wrk run (default 10), after a warm-up of each app
#   --connections C    wrk's connections (default 32), --threads T its threads (default 2)
#   --rounds R         rounds of alternation (default 3)
#   --pool N           each app's connection pool (default 16)
#   --keys N           keys of the replay scenario (default 64)
#   --conf LINE        an extra postgresql.conf line, e.g. --conf 'fsync = on' (repeatable; the
#                      cluster is tests/lib.sh's, with fsync off)
#   --smoke            what CI runs (bench-smoke): a second of each with 2 connections, one
#                      round; checks the script and the apps, not the speed. The axum app is then
#                      a debug build in target/clients, the folder where the lint, rust-client and
#                      e2e-apps suites build the Rust client with the same dependencies, so that
#                      only the app and the client crate are compiled (a release build of its
#                      own takes minutes on two cores)
#
# Every run is checked: no non-2xx answer and no socket error, plain and fresh insert one row
# per answered request (at most C more: requests in flight when wrk stops), a replay none.
# Writes OUT (default bench/results/http-<UTC time>): runs.tsv, summary.md, machine.txt.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

FRAMEWORKS="fastapi express axum go"
DURATION=10
CONNECTIONS=32
THREADS=2
ROUNDS=3
POOL=16
KEYS=64
WARMUP=3
SETTLE=0.5
SMOKE=false
OUT=""
CONF=()
while [ $# -gt 0 ]; do
    case $1 in
        --frameworks) FRAMEWORKS=$2; shift 2 ;;
        --duration) DURATION=$2; shift 2 ;;
        --connections) CONNECTIONS=$2; shift 2 ;;
        --threads) THREADS=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --pool) POOL=$2; shift 2 ;;
        --keys) KEYS=$2; shift 2 ;;
        --conf) CONF+=("$2"); shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --smoke) SMOKE=true; DURATION=1; CONNECTIONS=2; THREADS=1; ROUNDS=1; POOL=2; KEYS=4; WARMUP=0; SETTLE=0.1; shift ;;
        *) echo "bench/http.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
for n in "$DURATION" "$CONNECTIONS" "$THREADS" "$ROUNDS" "$POOL" "$KEYS"; do
    [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "bench/http.sh: '$n' is not a positive whole number" >&2; exit 2; }
done
for fw in $FRAMEWORKS; do
    [[ " fastapi express axum go " == *" $fw "* ]] || { echo "bench/http.sh: no framework '$fw' (known: fastapi express axum go)" >&2; exit 2; }
done
OUT=${OUT:-$BENCH/results/http-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
PORT=$(port_of http-bench)
CDIR=$(dir_of http-bench)

extension_installed || { echo "bench/http.sh: the extension is not installed into PostgreSQL $PG_MAJOR" >&2; exit 2; }
command -v wrk >/dev/null || { echo "bench/http.sh: wrk is not installed (scripts/install-deps.sh installs it)" >&2; exit 2; }

# --- the apps: built or installed from the checkout's packages ------------------------------

venv=$ROOT/clients/python/.venv
AXUM_BIN=$BENCH/http/axum/target/release/bench-http-axum
[ "$SMOKE" = true ] && AXUM_BIN=$ROOT/target/clients/debug/bench-http-axum
build_app() { # build_app FRAMEWORK
    case $1 in
        fastapi) # the venv of bench/send.sh and the Python suite; the package itself is read from the checkout
            if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import fastapi, uvicorn, psycopg_pool' 2>/dev/null; then
                python3 -m venv "$venv"
                "$venv/bin/pip" install -q --disable-pip-version-check -c "$ROOT/clients/python/constraints.txt" \
                    "$ROOT/clients/python[test]"
            fi ;;
        express) # --install-links: a copy of clients/node as it is now, with its own dependencies
            (cd "$BENCH/http/express" && npm ci --install-links --no-audit --no-fund --loglevel=error >/dev/null) ;;
        axum)
            if [ "$SMOKE" = true ]; then
                CARGO_TARGET_DIR=$ROOT/target/clients cargo build --locked --quiet --manifest-path "$BENCH/http/axum/Cargo.toml"
            else
                (cd "$BENCH/http/axum" && cargo build --release --quiet)
            fi ;;
        go)
            (cd "$BENCH/http/go" && go build -o target/bench-http-go .) ;;
    esac
}

# start_app FRAMEWORK on|off PORT DATABASE_URL: in the background, its log in $OUT/logs
start_app() {
    local fw=$1 mw=$2 port=$3 url=$4 log=$OUT/logs/$1-$2.log
    case $fw in
        fastapi)
            MIDDLEWARE=$mw POOL_SIZE=$POOL DATABASE_URL=$url PYTHONPATH=$ROOT/clients/python/src \
                "$venv/bin/python" -m uvicorn --app-dir "$BENCH/http/fastapi" app:app \
                --host 127.0.0.1 --port "$port" --no-access-log --log-level warning >"$log" 2>&1 & ;;
        express)
            MIDDLEWARE=$mw POOL_SIZE=$POOL DATABASE_URL=$url PORT=$port \
                node "$BENCH/http/express/app.mjs" >"$log" 2>&1 & ;;
        axum)
            MIDDLEWARE=$mw POOL_SIZE=$POOL DATABASE_URL=$url LISTEN_ADDR=127.0.0.1:$port \
                "$AXUM_BIN" >"$log" 2>&1 & ;;
        go)
            MIDDLEWARE=$mw POOL_SIZE=$POOL DATABASE_URL=$url LISTEN_ADDR=127.0.0.1:$port \
                "$BENCH/http/go/target/bench-http-go" >"$log" 2>&1 & ;;
    esac
    PIDS+=($!)
    APP_PID[$fw-$mw]=$!
}

wait_port() { # wait_port PORT: up to 30 s
    local i
    for i in $(seq 300); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

# post PORT KEY: status line, Idempotent-Replayed and body of one POST /charges, on one line
post() {
    curl -s -m 10 -D - -o - -X POST "http://127.0.0.1:$1/charges" -H 'Content-Type: application/json' \
        -H "Idempotency-Key: \"$2\"" -d '{"amount": 1250, "currency": "eur"}' |
        tr -d '\r' | awk 'NR == 1 { s = $2 } tolower($1) == "idempotent-replayed:" { r = $2 } /^\{/ { b = $0 } END { print s, (r ? r : "-"), b }'
}

PIDS=()
declare -A APP_PID
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    cluster_stop "$CDIR"
    rm -rf "$CDIR"
}
trap cleanup EXIT

for fw in $FRAMEWORKS; do build_app "$fw"; done
# Two pools per framework, and room for psql.
cluster_fresh "$CDIR" "$PORT" "$LISTEN_TCP" "max_connections = $((2 * POOL * $(wc -w <<<"$FRAMEWORKS") + 20))" "${CONF[@]}"
mkdir -p "$OUT/logs"
DB=postgres machine_info | tee "$OUT/machine.txt"
echo "wrk:         $(wrk -v 2>&1 | head -1), -t$THREADS -c$CONNECTIONS -d${DURATION}s; apps' pool $POOL; rounds $ROUNDS; replay keys $KEYS" | tee -a "$OUT/machine.txt"

declare -A PLAIN_PORT PROTECTED_PORT
i=0
for fw in $FRAMEWORKS; do
    db=bench_http_$fw
    fresh_database "$db" -h "$CDIR/socket" -p "$PORT" -U postgres
    DB=$db q -c "CREATE TABLE charges (id bigserial PRIMARY KEY, amount bigint NOT NULL, currency text NOT NULL)"
    PLAIN_PORT[$fw]=$((PORT + 1 + 2 * i))
    PROTECTED_PORT[$fw]=$((PORT + 2 + 2 * i))
    start_app "$fw" off "${PLAIN_PORT[$fw]}" "postgresql://postgres@127.0.0.1:$PORT/$db"
    start_app "$fw" on "${PROTECTED_PORT[$fw]}" "postgresql://postgres@127.0.0.1:$PORT/$db"
    i=$((i + 1))
done

# Each app answers as it should before it is measured; the replay keys are made.
for fw in $FRAMEWORKS; do
    for port in "${PLAIN_PORT[$fw]}" "${PROTECTED_PORT[$fw]}"; do
        wait_port "$port" || { echo "bench/http.sh: the $fw app on $port did not start:" >&2; cat "$OUT/logs/$fw"-*.log >&2; exit 1; }
    done
    plain=$(post "${PLAIN_PORT[$fw]}" check-plain)
    first=$(post "${PROTECTED_PORT[$fw]}" check-protected)
    again=$(post "${PROTECTED_PORT[$fw]}" check-protected)
    if [[ ! $plain =~ ^201\ -\ \{ ]] || [[ ! $first =~ ^201\ -\ \{ ]] || [ "$again" != "201 true ${first#201 - }" ]; then
        echo "bench/http.sh: $fw does not answer as it should: plain '$plain', protected '$first', then '$again'" >&2
        exit 1
    fi
    for k in $(seq 0 $((KEYS - 1))); do
        made=$(post "${PROTECTED_PORT[$fw]}" "replay-$k")
        [[ $made =~ ^201\ -\  ]] || { echo "bench/http.sh: $fw: making replay key $k answered '$made'" >&2; exit 1; }
    done
    echo "$fw: plain on ${PLAIN_PORT[$fw]}, protected on ${PROTECTED_PORT[$fw]}: answers checked, $KEYS replay keys made"
done

# run_wrk PORT SECONDS MODE PREFIX: the RESULT line's fields
run_wrk() {
    local args=(fresh "$4")
    [ "$3" = replay ] && args=(replay replay "$KEYS")
    wrk -t"$THREADS" -c"$CONNECTIONS" -d"$2"s --latency -s "$BENCH/http/wrk.lua" "http://127.0.0.1:$1/charges" -- "${args[@]}" |
        awk -F'\t' '$1 == "RESULT" { $1 = ""; print substr($0, 2) }'
}
rows_of() { DB=bench_http_$1 q -c "SELECT count(*) FROM charges"; }
# cpu_ticks PID...: user + system CPU time of these processes (all their threads), in clock ticks
cpu_ticks() {
    local pid total=0
    for pid in "$@"; do
        [ -r "/proc/$pid/stat" ] || continue
        # after the command's ") ", utime and stime are the 12th and 13th fields
        total=$((total + $(sed 's/.*) //' "/proc/$pid/stat" | awk '{ print $12 + $13 }')))
    done
    echo "$total"
}
# The cluster's server processes (the apps' pooled connections live through a run).
server_pids() { pgrep -P "$(head -1 "$CDIR/data/postmaster.pid")" || true; }
TICK_MS=$((1000 / $(getconf CLK_TCK)))

if [ "$WARMUP" -gt 0 ]; then
    for fw in $FRAMEWORKS; do
        run_wrk "${PLAIN_PORT[$fw]}" "$WARMUP" fresh "warm-plain" >/dev/null
        run_wrk "${PROTECTED_PORT[$fw]}" "$WARMUP" fresh "warm-fresh" >/dev/null
        run_wrk "${PROTECTED_PORT[$fw]}" "$WARMUP" replay - >/dev/null
    done
fi

SCENARIOS=(plain fresh replay)
bad=0
printf 'round\tframework\tscenario\trequests\tseconds\trps\tp50_ms\tp99_ms\tnon2xx\tsocket_errors\trows_added\tapp_cpu_ms_per_request\tdb_cpu_ms_per_request\n' >"$OUT/runs.tsv"
for round in $(seq "$ROUNDS"); do
    for fw in $FRAMEWORKS; do
        for j in 0 1 2; do
            scenario=${SCENARIOS[$(((j + round - 1) % 3))]}
            port=${PROTECTED_PORT[$fw]}
            [ "$scenario" = plain ] && port=${PLAIN_PORT[$fw]}
            sleep "$SETTLE" # the requests in flight when the last run stopped finish first
            before=$(rows_of "$fw")
            app=${APP_PID[$fw-on]}
            [ "$scenario" = plain ] && app=${APP_PID[$fw-off]}
            mapfile -t servers < <(server_pids)
            app_cpu=$(cpu_ticks "$app") db_cpu=$(cpu_ticks "${servers[@]}")
            read -r requests duration_us non2xx sockerr p50_us p99_us < <(run_wrk "$port" "$DURATION" "$scenario" "r$round-$scenario")
            app_cpu=$(($(cpu_ticks "$app") - app_cpu)) db_cpu=$(($(cpu_ticks "${servers[@]}") - db_cpu))
            added=$(($(rows_of "$fw") - before))
            line=$(awk -v r="$round" -v f="$fw" -v s="$scenario" -v n="$requests" -v d="$duration_us" -v p5="$p50_us" \
                -v p9="$p99_us" -v x="$non2xx" -v e="$sockerr" -v a="$added" -v ac="$((app_cpu * TICK_MS))" -v dc="$((db_cpu * TICK_MS))" \
                'BEGIN { printf "%s\t%s\t%s\t%d\t%.2f\t%.0f\t%.2f\t%.2f\t%d\t%d\t%d\t%.3f\t%.3f", r, f, s, n, d / 1e6, n / (d / 1e6), p5 / 1000, p9 / 1000, x, e, a, ac / (n ? n : 1), dc / (n ? n : 1) }')
            echo "$line" >>"$OUT/runs.tsv"
            echo "$line"
            if [ "$scenario" = replay ]; then want_low=0 want_high=0; else want_low=$requests want_high=$((requests + CONNECTIONS)); fi
            if [ "$non2xx" != 0 ] || [ "$sockerr" != 0 ] || [ "$added" -lt "$want_low" ] || [ "$added" -gt "$want_high" ] || [ "$requests" -eq 0 ]; then
                echo "FAIL $fw $scenario round $round: $non2xx non-2xx answers, $sockerr socket errors, $added rows added for $requests requests (expected $want_low to $want_high)"
                bad=$((bad + 1))
            fi
        done
    done
done

# Medians over the rounds, and the ratios against plain.
"$PY" - "$OUT/runs.tsv" "$SMOKE" "$bad" >"$OUT/summary.md" <<'EOF'
import csv
import statistics
import sys

rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
smoke, bad = sys.argv[2] == "true", int(sys.argv[3])
run = {(r["framework"], r["scenario"], r["round"]): r for r in rows}
rounds = sorted({r["round"] for r in rows}, key=int)


def median(fw, s, field):
    return statistics.median(float(run[fw, s, n][field]) for n in rounds)


def ratio(fw, s, field):
    """The median of the per-round ratios against plain (a round's runs lie close in time), and their range."""
    per_round = sorted(float(run[fw, s, n][field]) / float(run[fw, "plain", n][field]) for n in rounds)
    spread = f" ({per_round[0]:.2f}-{per_round[-1]:.2f})" if len(per_round) > 1 else ""
    return f"{statistics.median(per_round):.2f}x{spread}"


print("# bench/http.sh: an endpoint with the middleware against without it\n")
if smoke:
    print("**A smoke run: the figures mean nothing.**\n")
if bad:
    print(f"**{bad} runs failed their checks (non-2xx answers, socket errors or rows added): see runs.tsv.**\n")
print(f"Medians over {len(rounds)} rounds (runs.tsv has each run); the ratios are the median of each round's "
      "ratio against plain, their range in brackets. CPU per request: the app's process, and the "
      "database's server processes. Goals (issue 24): fresh >= 0.6x plain req/s and p50 <= 1.6x; "
      "replay >= 1.0x req/s.\n")
print("| framework | scenario | req/s | p50 ms | p99 ms | req/s vs plain | p50 vs plain "
      "| app CPU ms/req | db CPU ms/req |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
for fw in dict.fromkeys(r["framework"] for r in rows):
    for s in ("plain", "fresh", "replay"):
        vs = ("", "") if s == "plain" else (ratio(fw, s, "rps"), ratio(fw, s, "p50_ms"))
        print(f"| {fw} | {s} | {median(fw, s, 'rps'):.0f} | {median(fw, s, 'p50_ms'):.2f} "
              f"| {median(fw, s, 'p99_ms'):.2f} "
              f"| {vs[0]} | {vs[1]} | {median(fw, s, 'app_cpu_ms_per_request'):.3f} "
              f"| {median(fw, s, 'db_cpu_ms_per_request'):.3f} |")
EOF
cat "$OUT/summary.md"
echo "results: $OUT"
[ "$bad" -eq 0 ]
