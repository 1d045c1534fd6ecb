# Sourced by run.sh. A primary and a hot standby made with pg_basebackup -R, streaming over
# the primary's unix socket: lookups and fingerprints work on the standby, every write
# function answers 25006 with the extension's own message.

section "standby: a streaming hot standby"
sqlp() { psql_at "$PRIMARY" "$PRIMARY_PORT" postgres "$@" 2>>"$LOG"; }
sqls() { psql_at "$STANDBY" "$STANDBY_PORT" postgres "$@" 2>>"$LOG"; }
standby_state() { # standby_state SQL: "SQLSTATE message" of SQL run on the standby
    printf '\\o /dev/null\n%s\n\\o\n\\echo :SQLSTATE :LAST_ERROR_MESSAGE\n' "$1" | sqls postgres | tail -n 1
}

standby_ok=0
if start_cluster "$PRIMARY" "$PRIMARY_PORT" "wal_level = replica" "max_wal_senders = 5" "hot_standby = on" \
        >"$SEC_DIR/start-primary.log" 2>&1; then
    install_extension postgres -h "$PRIMARY/socket" -p "$PRIMARY_PORT" -U postgres 2>>"$LOG"
    sqlp postgres <<'SQL' >/dev/null
SELECT idempotency.idem_complete('acct', 'k-done', token, 201, '{"id": "ch_1"}', '{"Location": "/c/1"}')
  FROM idempotency.idem_claim('acct', 'k-done', 'fp');
SELECT * FROM idempotency.idem_claim('acct', 'k-open', 'fp', NULL, '1 hour');
SELECT * FROM idempotency.idem_claim('acct', 'k-stale', NULL, NULL, '1 millisecond');
SELECT * FROM idempotency.idem_claim('acct', 'k-exp', NULL, '1 millisecond');
SELECT idempotency.idem_seen('acct', 'm1');
SQL
    mkdir -p "$STANDBY"
    chown postgres: "$STANDBY" 2>/dev/null
    if as_postgres timeout 120 pg_basebackup -h "$PRIMARY/socket" -p "$PRIMARY_PORT" -U postgres -D "$STANDBY/data" \
            -R -X stream -c fast >"$SEC_DIR/basebackup.log" 2>&1; then
        as_postgres mkdir -p "$STANDBY/socket"
        {
            echo "port = $STANDBY_PORT"
            echo "unix_socket_directories = '$STANDBY/socket'"
            echo "hot_standby = on"
        } | as_postgres tee -a "$STANDBY/data/postgresql.conf" >/dev/null
        if start_cluster "$STANDBY" "$STANDBY_PORT" >"$SEC_DIR/start-standby.log" 2>&1; then
            standby_ok=1
        fi
    fi
fi
check "a primary and a hot standby (pg_basebackup -R, streaming replication) are running" "1 t" \
    "$standby_ok $(sqls postgres -c "SELECT pg_is_in_recovery()")"
if [ $standby_ok = 1 ]; then
    check "the primary streams to the standby" streaming \
        "$(sqlp postgres -c "SELECT state FROM pg_stat_replication")"
    check "standby: idem_lookup returns a replicated completed record" 'completed|201|{"id": "ch_1"}' \
        "$(sqls postgres -c "SELECT status, response_status, response_body::text FROM idempotency.idem_lookup('acct', 'k-done')")"
    check "standby: idem_lookup returns a replicated in_progress record" 'in_progress|1' \
        "$(sqls postgres -c "SELECT status, attempts FROM idempotency.idem_lookup('acct', 'k-open')")"
    check "standby: an expired record is absent there too" 0 \
        "$(sqls postgres -c "SELECT count(*) FROM idempotency.idem_lookup('acct', 'k-exp')")"

    # A record completed on the primary now reaches the standby by streaming.
    sqlp postgres -c "SELECT idempotency.idem_complete('acct', 'k-late', token, 202, '{\"late\": true}') FROM idempotency.idem_claim('acct', 'k-late')" >/dev/null
    seen=""
    for _ in $(seq 1 60); do
        seen=$(sqls postgres -c "SELECT response_status FROM idempotency.idem_lookup('acct', 'k-late')")
        [ "$seen" = 202 ] && break
        sleep 0.5
    done
    check "standby: a record completed on the primary afterwards is looked up on the standby" 202 "$seen"

    TOKEN=$(sqlp postgres -c "SELECT token FROM idempotency.keys WHERE key = 'k-open'")
    WRITES=(
        "idem_claim|SELECT * FROM idempotency.idem_claim('acct', 'new-key');"
        "idem_claim|SELECT * FROM idempotency.idem_claim('acct', 'k-done', 'fp');"
        "idem_complete|SELECT idempotency.idem_complete('acct', 'k-open', '$TOKEN', 200);"
        "idem_checkpoint|SELECT idempotency.idem_checkpoint('acct', 'k-open', '$TOKEN', 'step');"
        "idem_release|SELECT idempotency.idem_release('acct', 'k-open', '$TOKEN');"
        "idem_seen|SELECT idempotency.idem_seen('acct', 'm-new');"
        "idem_seen|SELECT idempotency.idem_seen('acct', 'm1');"
        "idem_sweep|SELECT idempotency.idem_sweep();"
        "idem_reclaim_stale|SELECT * FROM idempotency.idem_reclaim_stale();"
        "idem_reclaim_stale|SELECT * FROM idempotency.idem_reclaim_stale(10, false);"
        "idem_sweep|CALL idempotency.idem_sweep_all();"
    )
    for w in "${WRITES[@]}"; do
        fn=${w%%|*}
        stmt=${w#*|}
        check "standby: ${stmt//$TOKEN/<token>} fails with 25006 '$fn cannot run on a read-only server'" \
            "25006 $fn cannot run on a read-only server" "$(standby_state "$stmt")"
    done
    check "standby: the 25006 error carries the hint to claim on the primary" \
        "Claims must run on the primary; idem_lookup works on a standby." \
        "$(psql_at "$STANDBY" "$STANDBY_PORT" postgres postgres -c "SELECT idempotency.idem_claim('acct', 'x')" 2>&1 | sed -n 's/^HINT:  //p')"
    check "standby: idem_fingerprint(jsonb) works and agrees with the primary" \
        "$(sqlp postgres -c "SELECT idempotency.idem_fingerprint('{\"b\": [1.0, 2], \"a\": \"x\"}'::jsonb)")" \
        "$(sqls postgres -c "SELECT idempotency.idem_fingerprint('{\"b\": [1.0, 2], \"a\": \"x\"}'::jsonb)")"
    check "standby: idem_fingerprint(bytea) works" \
        "sha256:$(printf '\xde\xad\xbe\xef' | sha256sum | cut -d' ' -f1)" \
        "$(sqls postgres -c "SELECT idempotency.idem_fingerprint('\\xdeadbeef'::bytea)")"
    check "standby: the stats view works" "2|2" \
        "$(sqls postgres -c "SELECT in_progress, completed FROM idempotency.stats")"
    check "standby: nothing changed on the primary because of the standby's refusals" "k-done:completed,k-exp:in_progress,k-late:completed,k-open:in_progress,k-stale:in_progress|1" \
        "$(sqlp postgres -c "SELECT string_agg(key || ':' || status, ',' ORDER BY key), (SELECT count(*) FROM idempotency.messages) FROM idempotency.keys")"
    check "standby and primary logs: no crash, PANIC or internal error" "0 0" \
        "$(crash_lines "$STANDBY/server.log") $(crash_lines "$PRIMARY/server.log")"
else
    for f in "$SEC_DIR/start-primary.log" "$PRIMARY/server.log" "$SEC_DIR/basebackup.log" "$SEC_DIR/start-standby.log" "$STANDBY/server.log"; do
        [ -s "$f" ] && { echo "--- $f"; tail -n 15 "$f"; }
    done
fi
cluster_stop "$STANDBY"
cluster_stop "$PRIMARY"
