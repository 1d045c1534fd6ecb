package dev.pgidempotency;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.time.Duration;
import java.time.OffsetDateTime;
import java.util.List;
import java.util.UUID;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.MethodSource;

/** The client against the real extension, directly and through PgBouncer (transaction pooling). */
class ClientTest {
    private final IdempotencyClient idem = new IdempotencyClient();

    private static String key() {
        return "k-" + UUID.randomUUID();
    }

    @ParameterizedTest
    @MethodSource("dev.pgidempotency.Databases#both")
    void claimCompleteReplayMismatch(String db) throws Exception {
        try (Connection c = Databases.connect(db)) {
            String k = key();
            Claim first = idem.claim(c, "s", k, ClaimOptions.NONE.withFingerprint("sha256:a"));
            assertEquals(Outcome.CLAIMED, first.outcome());
            assertNotNull(first.token());
            assertEquals(1, first.attempts());
            String stored = idem.complete(c, "s", k, first.token(), 201, "{\"b\":1,  \"a\":[1.50]}", "{\"Location\":\"/x\"}");
            assertEquals("{\"a\": [1.50], \"b\": 1}", stored, "the body as jsonb prints it");
            Claim again = idem.claim(c, "s", k, ClaimOptions.NONE.withFingerprint("sha256:a"));
            assertEquals(Outcome.REPLAY, again.outcome());
            assertEquals(201, again.responseStatus());
            assertEquals(201, again.httpStatus());
            assertEquals(stored, again.responseBodyJson());
            assertEquals("{\"Location\": \"/x\"}", again.responseHeadersJson());
            Claim other = idem.claim(c, "s", k, ClaimOptions.NONE.withFingerprint("sha256:b"));
            assertEquals(Outcome.MISMATCH, other.outcome());
            assertEquals(422, other.httpStatus());
        }
    }

    @ParameterizedTest
    @MethodSource("dev.pgidempotency.Databases#both")
    void inProgressWithRetryAfterThenReclaimedOnceTheLeaseEnds(String db) throws Exception {
        try (Connection c = Databases.connect(db)) {
            String k = key();
            Claim owner = idem.claim(c, "s", k, ClaimOptions.NONE.withLease(Duration.ofSeconds(3)));
            Claim dup = idem.claim(c, "s", k, ClaimOptions.NONE);
            assertEquals(Outcome.IN_PROGRESS, dup.outcome());
            assertEquals(409, dup.httpStatus());
            assertTrue(dup.retryAfterSeconds() >= 1 && dup.retryAfterSeconds() <= 3, "Retry-After " + dup.retryAfterSeconds());
            String k2 = key();
            Claim short1 = idem.claim(c, "s", k2, ClaimOptions.NONE.withLease(Duration.ofMillis(50)));
            idem.checkpoint(c, "s", k2, short1.token(), "step-1", "{\"n\":1}", Duration.ofMillis(50));
            Thread.sleep(150);
            Claim taken = idem.claim(c, "s", k2, ClaimOptions.NONE.withLease(Duration.ofSeconds(5)));
            assertEquals(Outcome.RECLAIMED, taken.outcome());
            assertEquals(2, taken.attempts());
            assertEquals("step-1", taken.recoveryPoint());
            assertEquals("{\"n\": 1}", taken.recoveryDataJson());
            assertNotEquals(short1.token(), taken.token());
            assertThrows(IdempotencyException.ClaimTakenOver.class,
                    () -> idem.complete(c, "s", k2, short1.token(), 200, null, null));
            assertTrue(idem.release(c, "s", k, owner.token()));
            assertEquals(Outcome.CLAIMED, idem.claim(c, "s", k, ClaimOptions.NONE).outcome());
        }
    }

    @ParameterizedTest
    @MethodSource("dev.pgidempotency.Databases#both")
    void errorsBySqlstate(String db) throws Exception {
        try (Connection c = Databases.connect(db)) {
            assertEquals("22023", assertThrows(IdempotencyException.InvalidArgument.class,
                    () -> idem.claim(c, "s", "", ClaimOptions.NONE)).getSQLState());
            assertEquals("22004", assertThrows(IdempotencyException.NullArgument.class,
                    () -> idem.claim(c, "s", null, ClaimOptions.NONE)).getSQLState());
            assertThrows(IdempotencyException.InvalidArgument.class,
                    () -> idem.claim(c, "s", "k".repeat(256), ClaimOptions.NONE));
            assertThrows(IdempotencyException.InvalidArgument.class,
                    () -> idem.claim(c, "s", key(), ClaimOptions.NONE.withTtl(Duration.ZERO)));
            assertThrows(IdempotencyException.NoLiveRecord.class,
                    () -> idem.complete(c, "s", key(), UUID.randomUUID(), 200, null, null));
            String k = key();
            Claim cl = idem.claim(c, "s", k, ClaimOptions.NONE);
            assertThrows(IdempotencyException.InvalidArgument.class, () -> idem.complete(c, "s", k, cl.token(), 99, null, null));
            idem.complete(c, "s", k, cl.token(), 204, null, null);
            IdempotencyException.AlreadyCompleted done = assertThrows(IdempotencyException.AlreadyCompleted.class,
                    () -> idem.complete(c, "s", k, cl.token(), 204, null, null));
            assertEquals("IK003", done.getSQLState());
            assertFalse(idem.release(c, "s", k, UUID.randomUUID()));
        }
    }

    @ParameterizedTest
    @MethodSource("dev.pgidempotency.Databases#both")
    void sameTransactionRollbackForgetsTheClaim(String db) throws Exception {
        try (Connection c = Databases.connect(db)) {
            String k = key();
            c.setAutoCommit(false);
            assertEquals(Outcome.CLAIMED, idem.claim(c, "s", k, ClaimOptions.NONE).outcome());
            c.rollback();
            c.setAutoCommit(true);
            assertTrue(idem.lookup(c, "s", k).isEmpty());
            assertEquals(Outcome.CLAIMED, idem.claim(c, "s", k, ClaimOptions.NONE).outcome());
            IdempotencyClient.Record r = idem.lookup(c, "s", k).orElseThrow();
            assertEquals("in_progress", r.status());
            assertEquals(1, r.attempts());
        }
    }

    @ParameterizedTest
    @MethodSource("dev.pgidempotency.Databases#both")
    void aClaimRepeatedWithItsTokenAnswersClaimedAgain(String db) throws Exception {
        try (Connection c = Databases.connect(db)) {
            assertTrue(idem.features(c).claimToken(), "the extension under test has idem_claim(token)");
            String k = key();
            UUID token = UUID.randomUUID();
            ClaimOptions o = ClaimOptions.NONE.withToken(token).withLease(Duration.ofSeconds(30));
            Claim first = idem.claim(c, "s", k, o);
            Claim repeated = idem.claim(c, "s", k, o);
            assertEquals(token, first.token());
            assertEquals(Outcome.CLAIMED, repeated.outcome());
            assertEquals(token, repeated.token());
            assertEquals(1, repeated.attempts());
        }
    }

    /** Whether the session of {@code c} has a transaction id (has written), seen from {@code observer}. */
    private static boolean wrote(Connection observer, Connection c) throws Exception {
        int pid;
        try (ResultSet rs = c.createStatement().executeQuery("SELECT pg_backend_pid()")) {
            rs.next();
            pid = rs.getInt(1);
        }
        try (PreparedStatement st = observer.prepareStatement("SELECT backend_xid IS NOT NULL FROM pg_stat_activity WHERE pid = ?")) {
            st.setInt(1, pid);
            try (ResultSet rs = st.executeQuery()) {
                rs.next();
                return rs.getBoolean(1);
            }
        }
    }

    /**
     * Deferred (extension 0.6.0): a claim in the transaction of its complete writes nothing before
     * the complete; committed without one it leaves the in_progress record. Without deferred the
     * claim writes at once.
     */
    @ParameterizedTest
    @MethodSource("dev.pgidempotency.Databases#both")
    void aDeferredClaimWritesNothingUntilItsComplete(String db) throws Exception {
        try (Connection c = Databases.connect(db); Connection observer = Databases.connect("DATABASE_URL")) {
            assertTrue(idem.features(c).claimDeferred(), "the extension under test has idem_claim(deferred)");
            c.setAutoCommit(false);
            String k = key();
            Claim cl = idem.claim(c, "s", k, ClaimOptions.NONE.withDeferred(true));
            assertEquals(Outcome.CLAIMED, cl.outcome());
            assertFalse(wrote(observer, c), "a deferred claim has written nothing");
            assertEquals("in_progress", idem.lookup(c, "s", k).orElseThrow().status(), "its own transaction sees it");
            idem.complete(c, "s", k, cl.token(), 201, "{}", null);
            c.commit();
            assertEquals("completed", idem.lookup(observer, "s", k).orElseThrow().status());

            String open = key();
            idem.claim(c, "s", open, ClaimOptions.NONE.withDeferred(true).withLease(Duration.ofSeconds(30)));
            c.commit();
            assertEquals("in_progress", idem.lookup(observer, "s", open).orElseThrow().status(),
                    "a COMMIT without a complete writes the in_progress record");

            idem.claim(c, "s", key(), ClaimOptions.NONE);
            assertTrue(wrote(observer, c), "without deferred the claim writes at once");
            c.rollback();
        }
    }

    @ParameterizedTest
    @MethodSource("dev.pgidempotency.Databases#both")
    void checkpointSeenAndSeenMany(String db) throws Exception {
        try (Connection c = Databases.connect(db)) {
            String k = key();
            Claim cl = idem.claim(c, "s", k, ClaimOptions.NONE.withLease(Duration.ofSeconds(1)));
            OffsetDateTime until = idem.checkpoint(c, "s", k, cl.token(), "p", null, Duration.ofMinutes(10));
            assertTrue(until.isAfter(OffsetDateTime.now().plusMinutes(9)), until.toString());
            String m = key();
            assertTrue(idem.seen(c, "msgs", m, null));
            assertFalse(idem.seen(c, "msgs", m, null));
            assertArrayEquals(new boolean[] {false, true, false}, idem.seenMany(c, "msgs", List.of(m, m + "x", m + "x"), null));
            assertNull(idem.lookup(c, "s", key()).orElse(null));
        }
    }
}
