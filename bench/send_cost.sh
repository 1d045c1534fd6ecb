#!/usr/bin/env bash
# What a send costs the database: idem_send_next + idem_send_result per send, in sends per
# second with pgbench (no HTTP, no client package), at 1 and 4 sessions, in the backend's CPU
# microseconds per send, and in row versions written per send; implementations alternating
# within each round on one throwaway cluster (tests/lib.sh's "send-bench" row: run one send
# benchmark at a time):
#
#   old       the 0.5.0 portable release (the PL/pgSQL sending side as released)
#   portable  this tree's portable edition (the PL/pgSQL sending side both editions shared
#             until 0.6.0)
#   native    this tree's native extension (idem_send_next and idem_send_result in the library
#             since 0.6.0; the extension must be installed into PostgreSQL $PG_MAJOR)
#   hand      the hand-written outbox with a lease, in plain SQL: UPDATE ... SET state =
#             'sending' WHERE id = (SELECT ... FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING, then
#             UPDATE ... SET state = 'done' (bench/send.py's handlease, without the request)
#
#   bench/send_cost.sh [--seconds S] [--rounds R] [--impls "old portable native hand"] [--smoke]
#
#   --seconds S  each pgbench run (default 10)
#   --rounds R   rounds of alternation (default 3); medians reported
#   --impls L    which implementations (default all four)
#   --smoke      tiny runs: checks the script, not the speed
#
# Two kinds of send: first attempts answered 201 (the path every send takes), and due retries
# with the budget out of their way (send_retry_budget = 1000000 and a billion first attempts
# counted: each call takes the target's lock and reads the budget; not for hand, which has no
# budget). Each pgbench transaction runs idem_send_next(target, 1) and, when it got a send,
# idem_send_result(..., 201): two statements, each its own transaction, as the packages run
# them. Sends per second = sends done / the run's length. Row versions per send: inserts,
# updates and deletes of idempotency.outbound and idempotency.outbound_budget (pg_stat_user_tables)
# over the first-attempt runs at 4 sessions, per send done, plus the send's own INSERT (made
# before the timed part, as idem_send writes it). Then the same two calls in one backend (a
# procedure committing after each): the backend's CPU microseconds per send. Prints tables;
# writes nothing else.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

SECONDS_PER_RUN=10
ROUNDS=3
IMPLS="old portable native hand"
while [ $# -gt 0 ]; do
    case $1 in
        --seconds) SECONDS_PER_RUN=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --impls) IMPLS=$2; shift 2 ;;
        --smoke) SECONDS_PER_RUN=1; ROUNDS=1; shift ;;
        *) echo "bench/send_cost.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
PORT=$(port_of send-bench)
CDIR=$(dir_of send-bench)
WORK=$(mktemp -d)
trap 'cluster_stop "$CDIR"; rm -rf "$CDIR" "$WORK"' EXIT
case " $IMPLS " in
    *" native "*) extension_installed || { echo "bench/send_cost.sh: the extension is not installed into PostgreSQL $PG_MAJOR" >&2; exit 2; } ;;
esac

# The 0.5.0 portable release, from the last commit that holds it.
old_file=sql/portable/idempotency-portable--0.5.0.sql
old_rev=$(git -C "$ROOT" log -1 --diff-filter=AM --format=%H -- "$old_file")
git -C "$ROOT" show "$old_rev:$old_file" >"$WORK/old.sql"

cluster_fresh "$CDIR" "$PORT"
for impl in $IMPLS; do
    admin -c "CREATE DATABASE send_cost_$impl"
    case $impl in
        old) DB=send_cost_old q -f "$WORK/old.sql" >/dev/null ;;
        portable) DB=send_cost_portable q -f "$(portable_script)" >/dev/null ;;
        native) DB=send_cost_native q -c "CREATE EXTENSION idempotency" >/dev/null ;;
        hand) DB=send_cost_hand q -c "CREATE TABLE bench_outbox (
                id bigserial PRIMARY KEY, key text NOT NULL, request jsonb, state text NOT NULL DEFAULT 'pending',
                attempts int NOT NULL DEFAULT 0, next_attempt_at timestamptz NOT NULL DEFAULT now(),
                response_status int, response_body text, finished_at timestamptz);
              CREATE INDEX ON bench_outbox (next_attempt_at) WHERE state = 'pending'" >/dev/null ;;
        *) echo "bench/send_cost.sh: unknown implementation $impl" >&2; exit 2 ;;
    esac
done
machine_info

cat >"$WORK/ours.pgbench" <<'PGBENCH'
SELECT count(*) AS got, max(scope) AS scope, max(operation) AS operation, max(token::text) AS token FROM idempotency.idem_send_next('bench', 1, '1 minute') \gset
\if :got
SELECT state FROM idempotency.idem_send_result(':scope', ':operation', ':token', 201);
\endif
PGBENCH
cat >"$WORK/hand.pgbench" <<'PGBENCH'
WITH t AS (UPDATE bench_outbox SET state = 'sending', attempts = attempts + 1, next_attempt_at = now() + interval '1 minute' WHERE id = (SELECT id FROM bench_outbox WHERE state = 'pending' AND next_attempt_at <= now() ORDER BY next_attempt_at LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id, key, request) SELECT count(*) AS got, max(id) AS id FROM t \gset
\if :got
UPDATE bench_outbox SET state = 'done', response_status = 201, response_body = '{}', finished_at = now() WHERE id = :id AND state = 'sending';
\endif
PGBENCH

# prepare IMPL KIND COUNT: COUNT due sends of target 'bench', first attempts (attempts 0) or due
# retries (attempts 1), written as idem_send writes them (with no request). For retries, a
# billion first attempts counted just now keep the budget out of their way (0.5.0 allows
# ratio x first attempts + 10 a minute, whatever the answers). Then the tables' counters are reset.
prepare() {
    local db=send_cost_$1
    if [ "$1" = hand ]; then
        DB=$db q -c "TRUNCATE bench_outbox" \
            -c "INSERT INTO bench_outbox (key, next_attempt_at) SELECT gen_random_uuid()::text, now() - interval '1 second'
                  FROM generate_series(1, $3)" \
            -c "VACUUM ANALYZE bench_outbox" >/dev/null
        # In a session of its own: the one above reports its counters as it ends.
        DB=$db q -c "SELECT pg_stat_reset_single_table_counters('bench_outbox'::regclass)" >/dev/null
        return
    fi
    local attempts=0 budget_row=""
    [ "$2" = retries ] && attempts=1 budget_row="INSERT INTO idempotency.outbound_budget VALUES ('bench', now(), 0, 1000000000, 0)"
    DB=$db q -c "TRUNCATE idempotency.outbound, idempotency.outbound_budget" ${budget_row:+-c "$budget_row"} \
        -c "INSERT INTO idempotency.outbound (scope, operation, key, target, state, attempts, next_attempt_at, give_up_at, created_at)
            SELECT 'bench', 'op-' || i, gen_random_uuid()::text, 'bench', 'pending', $attempts,
                   now() - interval '1 second', now() + interval '1 day', now()
              FROM generate_series(1, $3) AS i" \
        -c "VACUUM ANALYZE idempotency.outbound" -c "VACUUM ANALYZE idempotency.outbound_budget" >/dev/null
    DB=$db q -c "SELECT pg_stat_reset_single_table_counters('idempotency.outbound'::regclass),
                   pg_stat_reset_single_table_counters('idempotency.outbound_budget'::regclass)" >/dev/null
}

done_sends() {
    if [ "$1" = hand ]; then
        DB=send_cost_hand q -c "SELECT count(*) FROM bench_outbox WHERE state = 'done'"
    else
        DB=send_cost_$1 q -c "SELECT count(*) FROM idempotency.outbound WHERE state = 'done'"
    fi
}

# versions IMPL SENDS: row versions written per send since prepare(), "ins/upd/del" of each
# table, counting the send's own INSERT (made by prepare, as idem_send makes it).
versions() {
    sleep 1.2 # pgbench's backends have reported their counters (at exit; stats flush at most each second)
    local tables="'idempotency.outbound'::regclass, 'idempotency.outbound_budget'::regclass"
    [ "$1" = hand ] && tables="'bench_outbox'::regclass"
    DB=send_cost_$1 q -c "SELECT string_agg(format('%s %s/%s/%s', c.relname,
               round(pg_stat_get_tuples_inserted(c.oid)::numeric / $2 + CASE WHEN c.relname IN ('outbound', 'bench_outbox') THEN 1 ELSE 0 END, 2),
               round(pg_stat_get_tuples_updated(c.oid)::numeric / $2, 2), round(pg_stat_get_tuples_deleted(c.oid)::numeric / $2, 2)),
               ', ' ORDER BY c.relname) || format(' (total %s)', round(sum(pg_stat_get_tuples_inserted(c.oid)
               + pg_stat_get_tuples_updated(c.oid) + pg_stat_get_tuples_deleted(c.oid))::numeric / $2 + 1, 2))
          FROM pg_class c WHERE c.oid IN ($tables)"
}

# run IMPL KIND CLIENTS: sends per second over one pgbench run; for first attempts at 4
# clients also the row versions per send (into got[versions/IMPL]).
run() {
    local budget="" script=$WORK/ours.pgbench
    [ "$2" = retries ] && budget="-c idempotency.send_retry_budget=1000000"
    [ "$1" = hand ] && script=$WORK/hand.pgbench
    # More due sends than a run can do: a run that empties them measures the backlog, not the rate.
    local count=$((SECONDS_PER_RUN * 30000 + 1000))
    prepare "$1" "$2" "$count"
    PGOPTIONS="$budget" pgbench -n -h "$CDIR/socket" -p "$PORT" -U postgres -c "$3" -j "$3" -T "$SECONDS_PER_RUN" \
        -f "$script" "send_cost_$1" >"$WORK/pgbench.log" 2>&1 || { cat "$WORK/pgbench.log" >&2; return 1; }
    local done_
    done_=$(done_sends "$1")
    [ "$done_" -lt "$count" ] || echo "bench/send_cost.sh: $1 $2 at $3 sessions did all $count sends: its rate is a floor" >&2
    if [ "$2" = first ] && [ "$3" = 4 ]; then
        versions "$1" "$done_" >"$WORK/versions-$1"
    fi
    awk -v n="$done_" -v s="$SECONDS_PER_RUN" 'BEGIN { printf "%.0f", n / s }'
}

# The same two calls in one backend, without a client in between: a procedure committing after
# each, N sends; the backend's own CPU time per send (utime + stime of /proc/self/stat, which
# the machine's other load hardly moves, unlike a throughput figure; median of the rounds).
LOOP_SENDS=$((SECONDS_PER_RUN * 1000))
TICK_US=$((1000000 / $(getconf CLK_TCK)))
for impl in $IMPLS; do
    take="SELECT * INTO r FROM idempotency.idem_send_next('bench', 1, '1 minute');"
    finish="PERFORM idempotency.idem_send_result(r.scope, r.operation, r.token, 201);"
    if [ "$impl" = hand ]; then
        take="UPDATE bench_outbox SET state = 'sending', attempts = attempts + 1, next_attempt_at = now() + interval '1 minute'
               WHERE id = (SELECT id FROM bench_outbox WHERE state = 'pending' AND next_attempt_at <= now()
                            ORDER BY next_attempt_at LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id, key, request INTO r;"
        finish="UPDATE bench_outbox SET state = 'done', response_status = 201, response_body = '{}', finished_at = now()
                 WHERE id = r.id AND state = 'sending';"
    fi
    DB=send_cost_$impl q -c "CREATE TABLE public.send_loop_cpu (us_per_send float8)" \
        -c "CREATE FUNCTION public.cpu_ticks() RETURNS bigint LANGUAGE sql AS \$\$
            SELECT split_part(s, ' ', 12)::bigint + split_part(s, ' ', 13)::bigint
              FROM substring(pg_read_file('/proc/self/stat') FROM '[)] (.*)\$') AS s \$\$" \
        -c "CREATE PROCEDURE public.send_loop(n int) LANGUAGE plpgsql AS \$\$
        DECLARE
            r record;
            t0 bigint := public.cpu_ticks();
        BEGIN
            FOR i IN 1 .. n LOOP
                $take
                COMMIT;
                $finish
                COMMIT;
            END LOOP;
            INSERT INTO public.send_loop_cpu VALUES ((public.cpu_ticks() - t0) * $TICK_US.0 / n);
        END \$\$" >/dev/null
done
# loop IMPL: the backend's CPU microseconds per send over one send_loop of first attempts.
loop() {
    prepare "$1" first $((LOOP_SENDS + 10))
    DB=send_cost_$1 q -c "TRUNCATE public.send_loop_cpu" -c "CALL public.send_loop($LOOP_SENDS)" >/dev/null
    DB=send_cost_$1 q -c "SELECT round(us_per_send::numeric, 1) FROM public.send_loop_cpu"
}

declare -A got
for round in $(seq 1 "$ROUNDS"); do
    for impl in $IMPLS; do
        got[loop/$impl]+="$(loop "$impl") "
    done
    for kind in first retries; do
        for clients in 1 4; do
            for impl in $IMPLS; do
                [ "$kind" = retries ] && [ "$impl" = hand ] && continue
                got[$kind/$clients/$impl]+="$(run "$impl" "$kind" "$clients") "
            done
        done
    done
    for impl in $IMPLS; do
        got[versions/$impl]=$(cat "$WORK/versions-$impl")
    done
    echo "round $round done"
done

median() { tr ' ' '\n' | grep . | sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
echo
printf '| sends | sessions |'
for impl in $IMPLS; do printf ' %s |' "$impl"; done
has() { case " $IMPLS " in *" $1 "*) return 0 ;; esac; return 1; }
if has native && has hand; then printf ' native / hand |'; fi
if has native && has portable; then printf ' native / portable |'; fi
echo
printf '| --- | --- |'
for _ in $IMPLS; do printf ' ---: |'; done
if has native && has hand; then printf ' ---: |'; fi
if has native && has portable; then printf ' ---: |'; fi
echo
declare -A med
for kind in first retries; do
    for clients in 1 4; do
        label=$([ "$kind" = first ] && echo "first attempts, 201: sends/s" || echo "due retries, budget out of the way: sends/s")
        printf '| %s | %s |' "$label" "$clients"
        for impl in $IMPLS; do
            if [ "$kind" = retries ] && [ "$impl" = hand ]; then printf ' |'; continue; fi
            med[$impl]=$(median <<<"${got[$kind/$clients/$impl]}")
            printf ' %s (%s) |' "${med[$impl]}" "${got[$kind/$clients/$impl]% }"
        done
        if has native && has hand; then
            if [ "$kind" = first ]; then printf ' **%.2fx** |' "$(awk -v a="${med[native]}" -v b="${med[hand]}" 'BEGIN { print a / b }')"; else printf ' |'; fi
        fi
        if has native && has portable; then printf ' %.2fx |' "$(awk -v a="${med[native]}" -v b="${med[portable]}" 'BEGIN { print a / b }')"; fi
        echo
    done
done
printf '| first attempts, one backend: its CPU µs per send | 1 |'
for impl in $IMPLS; do
    med[$impl]=$(median <<<"${got[loop/$impl]}")
    printf ' %s µs (%s) |' "${med[$impl]}" "${got[loop/$impl]% }"
done
if has native && has hand; then printf ' %.2fx |' "$(awk -v a="${med[native]}" -v b="${med[hand]}" 'BEGIN { print a / b }')"; fi
if has native && has portable; then printf ' %.2fx |' "$(awk -v a="${med[native]}" -v b="${med[portable]}" 'BEGIN { print a / b }')"; fi
echo
echo
echo "Row versions per send (first attempts, 4 sessions, the last round; table inserts/updates/deletes):"
for impl in $IMPLS; do
    echo "  $impl: ${got[versions/$impl]}"
done
