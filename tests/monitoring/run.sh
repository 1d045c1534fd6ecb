#!/usr/bin/env bash
# Monitoring as operators run it: Debian's prometheus-postgres-exporter with
# monitoring/queries.yaml against a cluster holding known records, /metrics scraped over
# HTTP on the loopback and every idempotency_* value checked; the alert rules checked
# (promtool check rules) and unit-tested (promtool test rules tests/monitoring/alerts.test.yaml).
# The pg_cron part (the sweep's and reclaim's last run) runs on 15 only: pg_cron is Debian's
# postgresql-15-cron. Installs prometheus-postgres-exporter and prometheus by apt if missing.
#   tests/monitoring/run.sh [DIR] [PORT]      (PORT: the cluster, PORT + 1: the exporter)
set -uo pipefail
. "$(dirname "$0")/../lib.sh" || exit 2
cd "$ROOT" || exit 2
DIR=${1:-$(dir_of monitoring)}
PORT=${2:-$(port_of monitoring)}
EXPORTER_PORT=$((PORT + 1))
DB=monitor

missing=()
for p in prometheus-postgres-exporter prometheus; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    fail "${missing[*]} missing: scripts/install-deps.sh installs them (a test installs nothing)"
    finish monitoring
    exit
fi
extension_installed || { fail "the extension is not installed into PostgreSQL $PG_MAJOR (cargo pgrx install)"; finish monitoring; exit; }

# --- the alert rules -----------------------------------------------------------------------
rules=$(promtool check rules monitoring/alerts.yaml 2>&1)
check_match "promtool check rules monitoring/alerts.yaml" "SUCCESS: 7 rules found" "$rules"
tests=$(promtool test rules tests/monitoring/alerts.test.yaml 2>&1)
check_match "promtool test rules: each alert fires above its threshold, not below" "SUCCESS" "$tests"
[[ $tests == *SUCCESS* ]] || echo "$tests" | head -40

# --- a cluster holding known records ---------------------------------------------------------
with_cron=false
conf=()
if [ "$PG_MAJOR" = 15 ]; then
    with_cron=true
    conf=("shared_preload_libraries = 'pg_cron'" "cron.database_name = '$DB'")
fi
cluster_fresh "$DIR" "$PORT" "$LISTEN_TCP" "${conf[@]}" || { fail "start the cluster"; finish monitoring; exit; }
exporter_pid=
cleanup() {
    [ -n "$exporter_pid" ] && kill "$exporter_pid" 2>/dev/null && wait "$exporter_pid" 2>/dev/null
    cluster_stop "$DIR"
}
trap cleanup EXIT
q() { psql -X -q -At -v ON_ERROR_STOP=1 -h "$DIR/socket" -p "$PORT" -U postgres -d "$DB" "$@"; }
if ! { psql -X -q -h "$DIR/socket" -p "$PORT" -U postgres -d postgres -c "CREATE DATABASE $DB" &&
        install_extension "$DB" -h "$DIR/socket" -p "$PORT" -U postgres; }; then
    fail "create the extension"; finish monitoring; exit
fi

# 3 completed, 3 in_progress (one stale: its lease ended; one claimed an hour ago), 4 expired
# records (2 completed, 2 in_progress); 5 live message ids and 2 expired ones. The expiry,
# the end of the lease and the hour are set by UPDATE (the time that would have passed).
q <<'SQL' >/dev/null || { fail "write the known records"; finish monitoring; exit; }
SET search_path = idempotency, public;
SELECT idem_complete('mon', 'done-' || i, (idem_claim('mon', 'done-' || i)).token, 200, '{"ok": true}')
  FROM generate_series(1, 5) AS i;
SELECT idem_claim('mon', 'busy-' || i) FROM generate_series(1, 5) AS i;
UPDATE keys SET expires_at = now() - interval '1 minute' WHERE key IN ('done-4', 'done-5', 'busy-4', 'busy-5');
UPDATE keys SET locked_until = now() - interval '1 minute' WHERE key = 'busy-3';
UPDATE keys SET created_at = now() - interval '1 hour' WHERE key = 'busy-1';
SELECT idem_seen('mon', 'msg-' || i) FROM generate_series(1, 7) AS i;
UPDATE messages SET expires_at = now() - interval '1 minute' WHERE message_id IN ('msg-6', 'msg-7');
-- The sending side: 9 sends. pending: two first attempts due now, a retry due for 10 minutes,
-- one not due yet; sending: one under its lease, one whose lease ended 2 minutes ago (due);
-- one done; two gave_up, the latest at 2026-11-30 11:00:00+00.
SELECT idem_send('mon', 'op-' || i, 'gateway') FROM generate_series(1, 9) AS i;
UPDATE outbound SET attempts = 1, next_attempt_at = now() - interval '10 minutes' WHERE operation = 'op-3';
UPDATE outbound SET attempts = 1, next_attempt_at = now() + interval '1 hour' WHERE operation = 'op-4';
UPDATE outbound SET state = 'sending', attempts = 1, token = gen_random_uuid(), locked_until = now() + interval '1 minute',
                    next_attempt_at = now() + interval '1 minute' WHERE operation = 'op-5';
UPDATE outbound SET state = 'sending', attempts = 1, token = gen_random_uuid(), locked_until = now() - interval '2 minutes',
                    next_attempt_at = now() - interval '2 minutes' WHERE operation = 'op-6';
UPDATE outbound SET state = 'done', attempts = 1, response_status = 201, finished_at = now(),
                    expires_at = now() + interval '1 day' WHERE operation = 'op-7';
UPDATE outbound SET state = 'gave_up', attempts = 5, finished_at = timestamptz '2026-11-30 10:00:00+00',
                    expires_at = now() + interval '1 day' WHERE operation = 'op-8';
UPDATE outbound SET state = 'gave_up', attempts = 5, finished_at = timestamptz '2026-11-30 11:00:00+00',
                    expires_at = now() + interval '1 day' WHERE operation = 'op-9';
SQL
# The exporter connects as an unprivileged role with the grants docs/monitoring.md lists.
# BYPASSRLS (and USAGE on schema cron, below): pg_cron shows a role only the jobs it
# scheduled (row-level security).
q >/dev/null <<'SQL' || fail "create the monitoring role"
CREATE ROLE monitoring LOGIN BYPASSRLS IN ROLE pg_monitor;
GRANT USAGE ON SCHEMA idempotency TO monitoring;
GRANT SELECT ON idempotency.stats TO monitoring;
SQL
sizes=$(q -c "SELECT string_agg(pg_total_relation_size(c)::text, ' ' ORDER BY c::text)
              FROM unnest(ARRAY['idempotency.keys'::regclass, 'idempotency.messages'::regclass]) AS c")
keys_size=${sizes% *}
messages_size=${sizes#* }

# pg_cron's record of the two jobs that schedule_maintenance() makes: runs with known times.
# The schedules (1 January) keep pg_cron from adding runs of its own during the test.
if $with_cron; then
    q >/dev/null <<'SQL' || fail "schedule the jobs and write their runs"
CREATE EXTENSION pg_cron;
GRANT USAGE ON SCHEMA cron TO monitoring;
SELECT * FROM idempotency.schedule_maintenance('0 0 1 1 *', '0 0 1 1 *');
INSERT INTO cron.job_run_details (jobid, runid, database, username, command, status, start_time, end_time)
SELECT j.jobid, nextval('cron.runid_seq'), 'monitor', 'postgres', j.command, r.status,
       r.start_time::timestamptz, r.end_time::timestamptz
  FROM cron.job AS j
  JOIN (VALUES
    ('idempotency-sweep', 'succeeded', '2026-11-30 10:00:00+00', '2026-11-30 10:00:02.5+00'),
    ('idempotency-sweep', 'failed', '2026-11-30 10:05:00+00', '2026-11-30 10:05:00.5+00'),
    ('idempotency-reclaim-stale', 'succeeded', '2026-11-30 10:01:00+00', '2026-11-30 10:01:00.25+00'),
    ('idempotency-reclaim-stale', 'running', '2026-11-30 10:02:00+00', NULL)
  ) AS r (jobname, status, start_time, end_time) USING (jobname);
SQL
fi

# --- the exporter, scraped over HTTP ---------------------------------------------------------
DATA_SOURCE_NAME="postgresql://monitoring@127.0.0.1:$PORT/$DB?sslmode=disable" \
    prometheus-postgres-exporter --web.listen-address="127.0.0.1:$EXPORTER_PORT" \
    --extend.query-path=monitoring/queries.yaml --log.level=warn >"$DIR/exporter.log" 2>&1 &
exporter_pid=$!
scrape() {
    /usr/bin/python3 - "http://127.0.0.1:$EXPORTER_PORT/metrics" <<'PY'
import sys, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
print(opener.open(sys.argv[1], timeout=10).read().decode())
PY
}
metrics=
for _ in $(seq 1 30); do
    metrics=$(scrape 2>/dev/null) && [[ $metrics == *idempotency_records* ]] && break
    sleep 1
done
check_match "the exporter answers /metrics on 127.0.0.1:$EXPORTER_PORT with idempotency_ metrics" \
    "idempotency_records" "$metrics"
[[ $metrics == *idempotency_records* ]] || { cat "$DIR/exporter.log"; finish monitoring; exit; }
ours=$(grep '^idempotency_' <<<"$metrics")
echo "$ours"

# value NAME [LABEL=VALUE]: the sample of NAME carrying that label (there must be one).
value() {
    local lines
    lines=$(grep -E "^$1(\{| )" <<<"$ours" | grep -F "${2:+$2\"}" | sed "s/^$1/X/")
    [ "$(grep -c . <<<"$lines")" = 1 ] || { echo "none or several: $lines"; return; }
    awk '{ print $NF }' <<<"$lines"
}
num() { awk -v v="$1" 'BEGIN { printf "%.6f", v }'; }

check "the query file loads without error" 0 "$(grep -E '^pg_exporter_user_queries_load_error\{' <<<"$metrics" | awk '{ print $NF }' | sort -u)"
check "idempotency_records{status=in_progress}" 3 "$(value idempotency_records 'status="in_progress')"
check "idempotency_records{status=completed}" 3 "$(value idempotency_records 'status="completed')"
check "idempotency_stale_claims" 1 "$(value idempotency_stale_claims)"
check "idempotency_expired_records{table=keys}" 4 "$(value idempotency_expired_records 'table="keys')"
check "idempotency_expired_records{table=messages}" 2 "$(value idempotency_expired_records 'table="messages')"
check "idempotency_seen_messages" 5 "$(value idempotency_seen_messages)"
age=$(value idempotency_oldest_claim_age_seconds)
check "idempotency_oldest_claim_age_seconds is the hour-old claim's age (3600 to 3700)" 1 \
    "$(awk -v a="$age" 'BEGIN { print (a >= 3600 && a < 3700) ? 1 : 0 }')"
check "idempotency_outbound_sends{state=pending}" 4 "$(value idempotency_outbound_sends 'state="pending')"
check "idempotency_outbound_sends{state=sending}" 2 "$(value idempotency_outbound_sends 'state="sending')"
check "idempotency_outbound_sends{state=gave_up}" 2 "$(value idempotency_outbound_sends 'state="gave_up')"
check "idempotency_outbound_due_sends: 3 pending due, 1 sending past its lease" 4 "$(value idempotency_outbound_due_sends)"
due_age=$(value idempotency_outbound_due_oldest_age_seconds)
check "idempotency_outbound_due_oldest_age_seconds is the 10-minute-old retry's (600 to 700)" 1 \
    "$(awk -v a="$due_age" 'BEGIN { print (a >= 600 && a < 700) ? 1 : 0 }')"
check "idempotency_outbound_gave_up_last_timestamp_seconds is the latest give-up's time" \
    "$(q -c "SELECT to_char(extract(epoch FROM timestamptz '2026-11-30 11:00:00+00'), 'FM9999999999.000000')")" \
    "$(num "$(value idempotency_outbound_gave_up_last_timestamp_seconds)")"
check "idempotency_table_size_bytes{table=keys} is pg_total_relation_size" "$keys_size" \
    "$(num "$(value idempotency_table_size_bytes 'table="keys')" | sed 's/\.0*$//')"
check "idempotency_table_size_bytes{table=messages} is pg_total_relation_size" "$messages_size" \
    "$(num "$(value idempotency_table_size_bytes 'table="messages')" | sed 's/\.0*$//')"

if $with_cron; then
    at() { q -c "SELECT to_char(extract(epoch FROM timestamptz '$1'), 'FM9999999999.000000')"; }
    check "sweep: runs_total" 2 "$(value idempotency_maintenance_runs_total 'job="sweep')"
    check "sweep: failures_total" 1 "$(value idempotency_maintenance_failures_total 'job="sweep')"
    check "sweep: last_success_timestamp_seconds is the end of the successful run" \
        "$(at '2026-11-30 10:00:02.5+00')" "$(num "$(value idempotency_maintenance_last_success_timestamp_seconds 'job="sweep')")"
    check "sweep: last_run_timestamp_seconds is the start of the failed (last) run" \
        "$(at '2026-11-30 10:05:00+00')" "$(num "$(value idempotency_maintenance_last_run_timestamp_seconds 'job="sweep')")"
    check "sweep: last_run_duration_seconds" "$(num 0.5)" "$(num "$(value idempotency_maintenance_last_run_duration_seconds 'job="sweep')")"
    check "sweep: last_run_failed" 1 "$(value idempotency_maintenance_last_run_failed 'job="sweep')"
    check "reclaim_stale: runs_total counts the running one too" 2 "$(value idempotency_maintenance_runs_total 'job="reclaim_stale')"
    check "reclaim_stale: failures_total" 0 "$(value idempotency_maintenance_failures_total 'job="reclaim_stale')"
    check "reclaim_stale: last finished run's duration (the running one is not finished)" "$(num 0.25)" \
        "$(num "$(value idempotency_maintenance_last_run_duration_seconds 'job="reclaim_stale')")"
    check "reclaim_stale: last_success_timestamp_seconds" "$(at '2026-11-30 10:01:00.25+00')" \
        "$(num "$(value idempotency_maintenance_last_success_timestamp_seconds 'job="reclaim_stale')")"
    check "reclaim_stale: last_run_failed" 0 "$(value idempotency_maintenance_last_run_failed 'job="reclaim_stale')"
else
    skip "the sweep's and reclaim's last run (pg_cron's cron.job_run_details)" \
        "pg_cron is Debian's postgresql-15-cron, built for PostgreSQL 15 only; not available for $PG_MAJOR here"
    check "without pg_cron only the maintenance metrics are missing" 0 \
        "$(grep -c '^idempotency_maintenance_' <<<"$ours")"
fi

# Prometheus' own lint of the exposition (names, units, _total on counters).
lint=$(grep -E '^# (HELP|TYPE) idempotency_|^idempotency_' <<<"$metrics" | promtool check metrics 2>&1)
check "promtool check metrics finds nothing to say about the idempotency_ metrics" "" "$lint"

finish monitoring
