package dev.pgidempotency;

import java.sql.Array;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Types;
import java.time.Duration;
import java.time.OffsetDateTime;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.UUID;

/**
 * The SQL contract of the idempotency extension on plain JDBC. Every method runs one statement on
 * the connection it is given, in that connection's transaction (or autocommit), so the claim, the
 * business writes and the stored response can share one transaction. Errors with the extension's
 * SQLSTATEs are thrown as {@link IdempotencyException} subclasses.
 *
 * <p>Every statement is a single parameterized query; with pgjdbc's {@code prepareThreshold=0}
 * nothing depends on server-side prepared statements, so it runs through PgBouncer in transaction
 * pooling mode.
 *
 * <p>Thread-safe: one instance per application (it caches what the installed extension offers).
 */
public final class IdempotencyClient {
    private static final String FEATURES_SQL = """
            SELECT coalesce(bool_or(p.proname = 'idem_claim' AND 'wait' = ANY (p.proargnames)), false),
                   coalesce(bool_or(p.proname = 'idem_claim' AND 'token' = ANY (p.proargnames)), false),
                   coalesce(bool_or(p.proname = 'idem_seen_many'), false),
                   coalesce(bool_or(p.proname = 'idem_claim' AND 'deferred' = ANY (p.proargnames)), false)
            FROM pg_catalog.pg_proc p
            WHERE p.pronamespace = 'idempotency'::regnamespace""";

    /**
     * What the installed extension offers beyond the first release: {@code idem_claim}'s {@code wait}
     * and {@code token} and {@code idem_seen_many} (0.4.0), {@code idem_claim}'s {@code deferred} (0.6.0).
     */
    public record Features(boolean claimWait, boolean claimToken, boolean seenMany, boolean claimDeferred) {}

    private volatile Features features;

    /** Looked up once (the first call) and cached. */
    public Features features(Connection db) throws SQLException {
        Features f = features;
        if (f == null) {
            try (PreparedStatement st = db.prepareStatement(FEATURES_SQL); ResultSet rs = st.executeQuery()) {
                rs.next();
                f = new Features(rs.getBoolean(1), rs.getBoolean(2), rs.getBoolean(3), rs.getBoolean(4));
            }
            features = f;
        }
        return f;
    }

    /** {@code idem_claim}; the options the installed extension lacks are left out (see {@link ClaimOptions}). */
    public Claim claim(Connection db, String scope, String key, ClaimOptions o) throws SQLException {
        Features f = features(db);
        List<Object> params = new ArrayList<>(List.of(nullable(scope), nullable(key)));
        params.add(nullable(o.fingerprint()));
        params.add(nullable(interval(o.ttl())));
        params.add(nullable(interval(o.lease())));
        StringBuilder extra = new StringBuilder();
        if (f.claimWait() && o.waitFor() != null) {
            extra.append(", wait => ?::interval");
            params.add(interval(o.waitFor()));
        }
        if (f.claimToken() && o.token() != null) {
            extra.append(", token => ?::uuid");
            params.add(o.token().toString());
        }
        if (f.claimDeferred() && o.deferred()) {
            extra.append(", deferred => true");
        }
        String sql = """
                SELECT c.outcome, c.token, c.http_status, c.response_status, c.response_headers::text,
                       c.response_body::text, c.recovery_point, c.recovery_data::text, c.attempts,
                       c.expires_at, c.locked_until,
                       CASE WHEN c.outcome = 'in_progress' AND c.locked_until IS NOT NULL
                            THEN greatest(1, ceil(extract(epoch FROM c.locked_until - clock_timestamp())))::int END
                FROM idempotency.idem_claim(?, ?, ?, ttl => ?::interval, lease => ?::interval%s) AS c"""
                .formatted(extra);
        return query(db, sql, params, rs -> new Claim(
                Outcome.of(rs.getString(1)),
                rs.getObject(2, UUID.class),
                (Integer) rs.getObject(3),
                (Integer) rs.getObject(4),
                rs.getString(5),
                rs.getString(6),
                rs.getString(7),
                rs.getString(8),
                rs.getInt(9),
                rs.getObject(10, OffsetDateTime.class),
                rs.getObject(11, OffsetDateTime.class),
                (Integer) rs.getObject(12)));
    }

    /**
     * {@code idem_complete}. {@code bodyJson} and {@code headersJson} are JSON texts (or null).
     * Returns the stored body as jsonb prints it (what every replay sends), or null.
     */
    public String complete(Connection db, String scope, String key, UUID token, int status, String bodyJson,
            String headersJson) throws SQLException {
        return query(db, "SELECT ?::jsonb::text FROM idempotency.idem_complete(?, ?, ?::uuid, ?, ?::jsonb, ?::jsonb)",
                List.of(nullable(bodyJson), nullable(scope), nullable(key), nullable(uuid(token)), status,
                        nullable(bodyJson), nullable(headersJson)),
                rs -> rs.getString(1));
    }

    /**
     * {@code idem_complete} and then {@code COMMIT}, in one round trip: pgjdbc sends the two
     * statements of one prepared statement with a single Sync. Autocommit must be off. When
     * {@code idem_complete} fails the server skips the COMMIT and the exception is the one
     * {@link #complete} throws; the transaction is left for the caller to roll back. When the COMMIT
     * fails (or its answer is lost) the exception is the COMMIT's: the outcome is unknown.
     */
    public String completeAndCommit(Connection db, String scope, String key, UUID token, int status, String bodyJson,
            String headersJson) throws SQLException {
        String sql = "SELECT ?::jsonb::text FROM idempotency.idem_complete(?, ?, ?::uuid, ?, ?::jsonb, ?::jsonb); COMMIT";
        try (PreparedStatement st = db.prepareStatement(sql)) {
            bind(st, List.of(nullable(bodyJson), nullable(scope), nullable(key), nullable(uuid(token)), status,
                    nullable(bodyJson), nullable(headersJson)));
            st.execute();
            try (ResultSet rs = st.getResultSet()) {
                return rs.next() ? rs.getString(1) : null;
            }
        } catch (SQLException e) {
            throw IdempotencyException.of(e);
        }
    }

    /** {@code idem_checkpoint}: records progress and renews the lease; returns the new locked_until. */
    public OffsetDateTime checkpoint(Connection db, String scope, String key, UUID token, String recoveryPoint,
            String recoveryDataJson, Duration lease) throws SQLException {
        return query(db, "SELECT idempotency.idem_checkpoint(?, ?, ?::uuid, ?, ?::jsonb, ?::interval)",
                List.of(nullable(scope), nullable(key), nullable(uuid(token)), nullable(recoveryPoint),
                        nullable(recoveryDataJson), nullable(interval(lease))),
                rs -> rs.getObject(1, OffsetDateTime.class));
    }

    /** {@code idem_release}: false when the token no longer owns a live in_progress record. */
    public boolean release(Connection db, String scope, String key, UUID token) throws SQLException {
        return query(db, "SELECT idempotency.idem_release(?, ?, ?::uuid)",
                List.of(nullable(scope), nullable(key), nullable(uuid(token))), rs -> rs.getBoolean(1));
    }

    /** One row of {@code idempotency.keys}, JSON columns as text. */
    public record Record(String scope, String key, String fingerprint, String status, UUID token, int attempts,
            OffsetDateTime lockedUntil, String recoveryPoint, String recoveryDataJson, Integer responseStatus,
            String responseHeadersJson, String responseBodyJson, OffsetDateTime expiresAt) {}

    /** {@code idem_lookup}: the live record, if any (read-only: works on a hot standby). */
    public Optional<Record> lookup(Connection db, String scope, String key) throws SQLException {
        String sql = """
                SELECT scope, key, fingerprint, status::text, token, attempts, locked_until, recovery_point,
                       recovery_data::text, response_status, response_headers::text, response_body::text, expires_at
                FROM idempotency.idem_lookup(?, ?)""";
        return Optional.ofNullable(query(db, sql, List.of(nullable(scope), nullable(key)), rs -> new Record(
                rs.getString(1), rs.getString(2), rs.getString(3), rs.getString(4), rs.getObject(5, UUID.class),
                rs.getInt(6), rs.getObject(7, OffsetDateTime.class), rs.getString(8), rs.getString(9),
                (Integer) rs.getObject(10), rs.getString(11), rs.getString(12), rs.getObject(13, OffsetDateTime.class))));
    }

    /** {@code idem_seen}: true the first time {@code messageId} is seen in the scope (recorded in this transaction). */
    public boolean seen(Connection db, String scope, String messageId, Duration ttl) throws SQLException {
        return query(db, "SELECT idempotency.idem_seen(?, ?, ?::interval)",
                List.of(nullable(scope), nullable(messageId), nullable(interval(ttl))), rs -> rs.getBoolean(1));
    }

    /** {@code idem_seen_many} (extension 0.4.0): element i is true when {@code messageIds[i]} is new. */
    public boolean[] seenMany(Connection db, String scope, List<String> messageIds, Duration ttl) throws SQLException {
        if (!features(db).seenMany()) {
            throw new IdempotencyException.UnsupportedFeature(
                    "the installed idempotency extension has no idem_seen_many (release 0.4.0)");
        }
        Array ids = db.createArrayOf("text", messageIds.toArray());
        try {
            return query(db, "SELECT idempotency.idem_seen_many(?, ?, ?::interval)",
                    List.of(nullable(scope), ids, nullable(interval(ttl))), rs -> {
                        Boolean[] values = (Boolean[]) rs.getArray(1).getArray();
                        boolean[] out = new boolean[values.length];
                        for (int i = 0; i < values.length; i++) {
                            out[i] = values[i];
                        }
                        return out;
                    });
        } finally {
            ids.free();
        }
    }

    /** {@code idem_fingerprint(jsonb, ignore)} computed by the database. */
    public String fingerprint(Connection db, String json, List<String> ignore) throws SQLException {
        Array arr = ignore == null ? null : db.createArrayOf("text", ignore.toArray());
        try {
            return query(db, "SELECT idempotency.idem_fingerprint(?::jsonb, ?::text[])",
                    List.of(nullable(json), arr == null ? Null.TEXT_ARRAY : arr), rs -> rs.getString(1));
        } finally {
            if (arr != null) {
                arr.free();
            }
        }
    }

    /** A Duration as PostgreSQL interval text, or null. */
    static String interval(Duration d) {
        if (d == null) {
            return null;
        }
        return d.toMillis() + " milliseconds";
    }

    private static String uuid(UUID u) {
        return u == null ? null : u.toString();
    }

    private enum Null {
        VARCHAR,
        TEXT_ARRAY
    }

    private static Object nullable(Object v) {
        return v == null ? Null.VARCHAR : v;
    }

    @FunctionalInterface
    private interface Row<T> {
        T read(ResultSet rs) throws SQLException;
    }

    /** Runs one statement; the first row read by {@code row}, or null when there is none. */
    private static <T> T query(Connection db, String sql, List<Object> params, Row<T> row) throws SQLException {
        try (PreparedStatement st = db.prepareStatement(sql)) {
            bind(st, params);
            try (ResultSet rs = st.executeQuery()) {
                return rs.next() ? row.read(rs) : null;
            }
        } catch (SQLException e) {
            throw IdempotencyException.of(e);
        }
    }

    private static void bind(PreparedStatement st, List<Object> params) throws SQLException {
        for (int i = 0; i < params.size(); i++) {
            Object p = params.get(i);
            if (p == Null.VARCHAR) {
                st.setNull(i + 1, Types.VARCHAR);
            } else if (p == Null.TEXT_ARRAY) {
                st.setNull(i + 1, Types.ARRAY);
            } else if (p instanceof Array a) {
                st.setArray(i + 1, a);
            } else if (p instanceof Integer n) {
                st.setInt(i + 1, n);
            } else {
                st.setString(i + 1, p.toString());
            }
        }
    }
}
