#!/usr/bin/env bash
# What the retry budget of issue 32 costs a send: idem_send_next + idem_send_result per send, in
# sends per second with pgbench, at 1 and 4 sessions, the 0.5.0 sending side against this
# tree's. Both in the portable edition, so that only the sending side differs: its functions
# are the same PL/pgSQL in both editions (sql/send.sql), and idem_send (which differs only in
# its fingerprint) runs before the timed part. One throwaway cluster (tests/lib.sh's
# "send-bench" row: run one send benchmark at a time).
#
#   bench/send_cost.sh [--seconds S] [--rounds R] [--smoke]
#
#   --seconds S  each pgbench run (default 10)
#   --rounds R   rounds of alternation between the two releases (default 3); medians reported
#   --smoke      tiny runs: checks the script, not the speed
#
# Two kinds of send: first attempts answered 201 (the path every send takes), and due retries
# with the budget out of their way (send_retry_budget = 1000000 and a billion first attempts
# counted: each call takes the target's lock and reads the budget).
# Each pgbench transaction runs idem_send_next(target, 1) and, when it got a send,
# idem_send_result(..., 201): two statements, each its own transaction, as the packages run
# them. Sends per second = sends done / the run's length. Then the same two calls in one backend
# (a procedure): the backend's CPU microseconds per send. Prints a table; writes nothing else.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

SECONDS_PER_RUN=10
ROUNDS=3
while [ $# -gt 0 ]; do
    case $1 in
        --seconds) SECONDS_PER_RUN=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --smoke) SECONDS_PER_RUN=1; ROUNDS=1; shift ;;
        *) echo "bench/send_cost.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
PORT=$(port_of send-bench)
CDIR=$(dir_of send-bench)
WORK=$(mktemp -d)
trap 'cluster_stop "$CDIR"; rm -rf "$CDIR" "$WORK"' EXIT

# The 0.5.0 portable release, from the last commit that holds it.
old_file=sql/portable/idempotency-portable--0.5.0.sql
old_rev=$(git -C "$ROOT" log -1 --diff-filter=AM --format=%H -- "$old_file")
git -C "$ROOT" show "$old_rev:$old_file" >"$WORK/old.sql"
new_file=$(portable_script)

cluster_fresh "$CDIR" "$PORT"
for db in old new; do
    admin -c "CREATE DATABASE send_cost_$db"
done
DB=send_cost_old q -f "$WORK/old.sql" >/dev/null
DB=send_cost_new q -f "$new_file" >/dev/null
machine_info

cat >"$WORK/send.pgbench" <<'PGBENCH'
SELECT count(*) AS got, max(scope) AS scope, max(operation) AS operation, max(token::text) AS token FROM idempotency.idem_send_next('bench', 1, '1 minute') \gset
\if :got
SELECT state FROM idempotency.idem_send_result(':scope', ':operation', ':token', 201);
\endif
PGBENCH

# prepare DB KIND COUNT: COUNT due sends of target 'bench', first attempts (attempts 0) or due
# retries (attempts 1), written as idem_send writes them (with no request). For retries, a
# billion first attempts counted just now keep the budget out of their way in both releases
# (0.5.0 allows ratio x first attempts + 10 a minute, whatever the answers).
prepare() {
    local attempts=0 budget_row=""
    [ "$2" = retries ] && attempts=1 budget_row="INSERT INTO idempotency.outbound_budget VALUES ('bench', now(), 0, 1000000000, 0)"
    DB=$1 q -c "TRUNCATE idempotency.outbound, idempotency.outbound_budget" ${budget_row:+-c "$budget_row"} \
        -c "INSERT INTO idempotency.outbound (scope, operation, key, target, state, attempts, next_attempt_at, give_up_at, created_at)
            SELECT 'bench', 'op-' || i, gen_random_uuid()::text, 'bench', 'pending', $attempts,
                   now() - interval '1 second', now() + interval '1 day', now()
              FROM generate_series(1, $3) AS i" \
        -c "VACUUM ANALYZE idempotency.outbound" -c "VACUUM ANALYZE idempotency.outbound_budget" >/dev/null
}

# run DB KIND CLIENTS: sends per second over one pgbench run.
run() {
    local budget=""
    [ "$2" = retries ] && budget="-c idempotency.send_retry_budget=1000000"
    prepare "$1" "$2" $((SECONDS_PER_RUN * 5000 + 1000))
    PGOPTIONS="$budget" pgbench -n -h "$CDIR/socket" -p "$PORT" -U postgres -c "$3" -j "$3" -T "$SECONDS_PER_RUN" \
        -f "$WORK/send.pgbench" "$1" >"$WORK/pgbench.log" 2>&1 || { cat "$WORK/pgbench.log" >&2; return 1; }
    local done_
    done_=$(DB=$1 q -c "SELECT count(*) FROM idempotency.outbound WHERE state = 'done'")
    awk -v n="$done_" -v s="$SECONDS_PER_RUN" 'BEGIN { printf "%.0f", n / s }'
}

# The same two calls in one backend, without a client in between: a procedure committing after
# each, N sends; the backend's own CPU time per send (utime + stime of /proc/self/stat, which
# the machine's other load hardly moves, unlike a throughput figure; median of the rounds).
LOOP_SENDS=$((SECONDS_PER_RUN * 1000))
TICK_US=$((1000000 / $(getconf CLK_TCK)))
for db in send_cost_old send_cost_new; do
    DB=$db q -c "CREATE TABLE public.send_loop_cpu (us_per_send float8)" \
        -c "CREATE PROCEDURE public.send_loop(n int) LANGUAGE plpgsql AS \$\$
        DECLARE
            r record;
            t0 bigint := public.cpu_ticks();
        BEGIN
            FOR i IN 1 .. n LOOP
                SELECT * INTO r FROM idempotency.idem_send_next('bench', 1, '1 minute');
                COMMIT;
                PERFORM idempotency.idem_send_result(r.scope, r.operation, r.token, 201);
                COMMIT;
            END LOOP;
            INSERT INTO public.send_loop_cpu VALUES ((public.cpu_ticks() - t0) * $TICK_US.0 / n);
        END \$\$" \
        -c "CREATE FUNCTION public.cpu_ticks() RETURNS bigint LANGUAGE sql AS \$\$
            SELECT split_part(s, ' ', 12)::bigint + split_part(s, ' ', 13)::bigint
              FROM substring(pg_read_file('/proc/self/stat') FROM '[)] (.*)\$') AS s \$\$" >/dev/null
done
# loop DB: the backend's CPU microseconds per send over one send_loop of first attempts.
loop() {
    prepare "$1" first $((LOOP_SENDS + 10))
    DB=$1 q -c "TRUNCATE public.send_loop_cpu" -c "CALL public.send_loop($LOOP_SENDS)" >/dev/null
    DB=$1 q -c "SELECT round(us_per_send::numeric, 1) FROM public.send_loop_cpu"
}

declare -A got
for round in $(seq 1 "$ROUNDS"); do
    for db in send_cost_old send_cost_new; do
        got[loop/$db]+="$(loop "$db") "
    done
    for kind in first retries; do
        for clients in 1 4; do
            for db in send_cost_old send_cost_new; do
                got[$kind/$clients/$db]+="$(run "$db" "$kind" "$clients") "
            done
        done
    done
    echo "round $round done"
done

median() { tr ' ' '\n' | grep . | sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
echo
echo "| sends | sessions | 0.5.0 sends/s | this tree sends/s | ratio | runs (0.5.0; this tree) |"
echo "| --- | --- | --- | --- | --- | --- |"
for kind in first retries; do
    for clients in 1 4; do
        old=$(median <<<"${got[$kind/$clients/send_cost_old]}")
        new=$(median <<<"${got[$kind/$clients/send_cost_new]}")
        label=$([ "$kind" = first ] && echo "first attempts, 201" || echo "due retries, budget out of the way")
        printf '| %s | %s | %s | %s | %.2fx | %s; %s |\n' "$label" "$clients" "$old" "$new" \
            "$(awk -v a="$new" -v b="$old" 'BEGIN { print a / b }')" \
            "${got[$kind/$clients/send_cost_old]% }" "${got[$kind/$clients/send_cost_new]% }"
    done
done
old=$(median <<<"${got[loop/send_cost_old]}")
new=$(median <<<"${got[loop/send_cost_new]}")
printf '| first attempts, one backend: its CPU µs per send | 1 | %s µs | %s µs | %+.1f µs | %s; %s |\n' "$old" "$new" \
    "$(awk -v a="$new" -v b="$old" 'BEGIN { print a - b }')" "${got[loop/send_cost_old]% }" "${got[loop/send_cost_new]% }"
