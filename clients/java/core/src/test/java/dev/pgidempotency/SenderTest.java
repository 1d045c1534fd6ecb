package dev.pgidempotency;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.time.Duration;
import java.time.OffsetDateTime;
import java.time.ZoneOffset;
import java.time.ZonedDateTime;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Optional;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.atomic.AtomicBoolean;
import org.junit.jupiter.api.Test;
import org.postgresql.ds.PGSimpleDataSource;

/** The sender against the real extension and a real HTTP receiver (the JDK's HttpServer, in this process). */
class SenderTest {
    /** Answers the script's statuses in order (the last from then on) and logs every request's key. */
    static final class Receiver implements AutoCloseable {
        final HttpServer server;
        final List<String> keys = Collections.synchronizedList(new ArrayList<>());

        Receiver(String... script) throws IOException {
            server = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
            server.createContext("/charges", ex -> {
                ex.getRequestBody().readAllBytes();
                keys.add(ex.getRequestHeaders().getFirst("Idempotency-Key"));
                String[] step = script[Math.min(keys.size(), script.length) - 1].split(" ");
                for (int i = 1; i + 1 < step.length; i += 2) {
                    ex.getResponseHeaders().add(step[i], step[i + 1]);
                }
                byte[] body = "{\"ok\": true}".getBytes(StandardCharsets.UTF_8);
                ex.sendResponseHeaders(Integer.parseInt(step[0]), body.length);
                ex.getResponseBody().write(body);
                ex.close();
            });
            server.start();
        }

        String url() {
            return "http://127.0.0.1:" + server.getAddress().getPort() + "/charges";
        }

        @Override
        public void close() {
            server.stop(0);
        }
    }

    private static PGSimpleDataSource dataSource(String options) {
        PGSimpleDataSource ds = new PGSimpleDataSource();
        ds.setURL(Databases.url("DATABASE_URL"));
        if (options != null) {
            ds.setOptions(options);
        }
        return ds;
    }

    /** Sessions whose backoff is short, so that retries come within the test. */
    private static PGSimpleDataSource quick() {
        return dataSource("-c idempotency.send_backoff_base=50ms -c idempotency.send_backoff_cap=200ms");
    }

    private static String unique(String prefix) {
        return prefix + "-" + UUID.randomUUID();
    }

    private static String prepared(PGSimpleDataSource ds, String operation, String target, Duration giveUpAfter)
            throws SQLException {
        try (Connection c = ds.getConnection()) {
            c.setAutoCommit(false);
            String key = Sender.prepare(c, "shop", operation, target, "{\"amount\": 1}", null, giveUpAfter).key();
            c.commit();
            return key;
        }
    }

    private static Sender sender(PGSimpleDataSource ds, String target, String url) {
        return Sender.builder(ds).url(target, url).timeout(Duration.ofSeconds(2)).lease(Duration.ofSeconds(5))
                .pollInterval(Duration.ofMillis(100)).build();
    }

    @Test
    void keyHeaderAndRetryAfter() {
        assertEquals("\"abc-1\"", Sender.keyHeader("abc-1"));
        assertEquals("\"a\\\"b\\\\c\"", Sender.keyHeader("a\"b\\c"));
        ZonedDateTime now = ZonedDateTime.of(2015, 10, 21, 7, 28, 0, 0, ZoneOffset.UTC);
        assertEquals(Optional.of(Duration.ofSeconds(120)), Sender.parseRetryAfter("120", now));
        assertEquals(Optional.of(Duration.ofSeconds(30)), Sender.parseRetryAfter("Wed, 21 Oct 2015 07:28:30 GMT", now));
        assertEquals(Optional.of(Duration.ZERO), Sender.parseRetryAfter("Wed, 21 Oct 2015 07:27:00 GMT", now));
        assertEquals(Optional.of(Sender.MAX_RETRY_AFTER), Sender.parseRetryAfter("99999999999999999999999", now));
        for (String bad : new String[] {"", "soon", "-5", "1.5", null}) {
            assertEquals(Optional.empty(), Sender.parseRetryAfter(bad, now), bad);
        }
        assertThrows(IllegalArgumentException.class, () -> Sender.builder(dataSource(null)).build());
        assertThrows(IllegalArgumentException.class, () -> Sender.builder(dataSource(null)).url("t", "http://x/")
                .timeout(Duration.ofSeconds(30)).lease(Duration.ofSeconds(30)).build());
    }

    @Test
    void prepareIsPartOfTheTransactionAndKeepsTheKey() throws SQLException {
        PGSimpleDataSource ds = dataSource(null);
        String op = unique("order");
        String target = unique("t");
        String gone;
        try (Connection c = ds.getConnection()) {
            c.setAutoCommit(false);
            gone = Sender.prepare(c, "shop", op, target, null, null, null).key();
            c.rollback();
        }
        String key = prepared(ds, op, target, null);
        assertNotEquals(gone, key, "a rolled-back send's key is forgotten with it");
        try (Connection c = ds.getConnection()) {
            c.setAutoCommit(false);
            Sender.Prepared again = Sender.prepare(c, "shop", op, target, "{\"amount\": 1}", null, null);
            assertEquals(key, again.key());
            assertEquals("pending", again.state());
            assertThrows(IdempotencyException.OperationReused.class,
                    () -> Sender.prepare(c, "shop", op, target, "{\"amount\": 2}", null, null));
            c.rollback();
            assertThrows(IdempotencyException.InvalidArgument.class,
                    () -> Sender.prepare(c, "shop", unique("order"), target, null, "", null));
            c.rollback();
        }
    }

    @Test
    void deliverSendsOnceWithTheKeyAndReturnsTheAnswer() throws Exception {
        PGSimpleDataSource ds = dataSource(null);
        String op = unique("order");
        String target = unique("t");
        String key = prepared(ds, op, target, null);
        try (Receiver r = new Receiver("201 Location /charges/1"); Sender s = sender(ds, target, r.url())) {
            SendResult.Delivered d = assertInstanceOf(SendResult.Delivered.class, s.deliver("shop", op));
            assertEquals(201, d.status());
            assertEquals("/charges/1", d.headers().get("location"));
            assertEquals("{\"ok\": true}", d.body());
            assertEquals(List.of(Sender.keyHeader(key)), r.keys);
            SendResult again = s.deliver("shop", op);
            assertEquals(201, assertInstanceOf(SendResult.Delivered.class, again).status());
            assertEquals(1, r.keys.size(), "delivered again: the stored answer, no second request");
            assertThrows(IllegalArgumentException.class, () -> s.deliver("shop", unique("never")));
        }
    }

    @Test
    void theWorkerRetries503WithTheSameKeyAndA422IsFinal() throws Exception {
        PGSimpleDataSource ds = quick();
        String op = unique("order");
        String target = unique("t");
        String key = prepared(ds, op, target, null);
        try (Receiver r = new Receiver("503", "503", "422"); Sender s = sender(ds, target, r.url())) {
            SendResult.NotYet first = assertInstanceOf(SendResult.NotYet.class, s.deliver("shop", op));
            assertEquals("pending", first.state());
            assertEquals(503, first.lastStatus());
            CompletableFuture.runAsync(() -> s.run(target, true, () -> false)).get(30, java.util.concurrent.TimeUnit.SECONDS);
            assertEquals(List.of(Sender.keyHeader(key), Sender.keyHeader(key), Sender.keyHeader(key)), r.keys);
            SendResult end = s.status("shop", op).orElseThrow();
            assertEquals(422, assertInstanceOf(SendResult.Delivered.class, end).status());
        }
    }

    @Test
    void retryAfterHoldsTheRetryBackAndNoAnswerIsRetried() throws Exception {
        PGSimpleDataSource ds = quick();
        String op = unique("order");
        String target = unique("t");
        prepared(ds, op, target, null);
        OffsetDateTime before = OffsetDateTime.now();
        try (Receiver r = new Receiver("429 Retry-After 30"); Sender s = sender(ds, target, r.url())) {
            SendResult.NotYet ny = assertInstanceOf(SendResult.NotYet.class, s.deliver("shop", op));
            assertTrue(Duration.between(before, ny.nextAttemptAt()).toSeconds() >= 29, ny.toString());
            assertEquals(0, s.runOnce(target), "nothing is due before Retry-After");
        }
        int closed;
        try (ServerSocket sock = new ServerSocket(0)) {
            closed = sock.getLocalPort();
        }
        String op2 = unique("order");
        String target2 = unique("t");
        prepared(ds, op2, target2, null);
        try (Sender s = sender(ds, target2, "http://127.0.0.1:" + closed + "/charges")) {
            SendResult.NotYet down = assertInstanceOf(SendResult.NotYet.class, s.deliver("shop", op2));
            assertEquals(null, down.lastStatus());
            assertTrue(down.lastError().startsWith("connection failed"), down.lastError());
        }
    }

    @Test
    void noFinalAnswerBeforeGiveUpAfterIsUnknown() throws Exception {
        PGSimpleDataSource ds = quick();
        String op = unique("order");
        String target = unique("t");
        String key = prepared(ds, op, target, Duration.ofMillis(600));
        try (Receiver r = new Receiver("503"); Sender s = sender(ds, target, r.url())) {
            s.run(target, true, () -> false);
            SendResult.Unknown u = assertInstanceOf(SendResult.Unknown.class, s.status("shop", op).orElseThrow());
            assertEquals(key, u.key());
            assertTrue(!r.keys.isEmpty());
        }
    }

    @Test
    void aResultAfterTheLeaseWasTakenOverIsLost() throws Exception {
        PGSimpleDataSource ds = dataSource(null);
        String op = unique("order");
        String target = unique("t");
        prepared(ds, op, target, null);
        Sender slow = Sender.builder(ds).timeout(Duration.ofMillis(100)).lease(Duration.ofMillis(300)).send(a -> {
            try {
                Thread.sleep(900);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            return new Sender.Answer(201, java.util.Map.of(), null, null);
        }).build();
        CompletableFuture<Integer> other = CompletableFuture.supplyAsync(() -> {
            try (Connection c = ds.getConnection(); PreparedStatement st = c.prepareStatement(
                    "SELECT count(*) FROM idempotency.idem_send_next(scope => 'shop', operation => ?, lease => '1 minute')")) {
                Thread.sleep(500);
                st.setString(1, op);
                try (ResultSet rs = st.executeQuery()) {
                    rs.next();
                    return rs.getInt(1);
                }
            } catch (SQLException | InterruptedException e) {
                throw new RuntimeException(e);
            }
        });
        try (slow) {
            SendResult late = slow.deliver("shop", op);
            assertEquals(1, other.get());
            assertEquals(new SendResult.Lost("shop", op), late);
            assertEquals("sending",
                    assertInstanceOf(SendResult.NotYet.class, slow.status("shop", op).orElseThrow()).state());
        }
    }

    @Test
    void theWorkerWakesOnNotifyNotOnItsPoll() throws Exception {
        PGSimpleDataSource ds = dataSource(null);
        String target = unique("t");
        AtomicBoolean stop = new AtomicBoolean();
        try (Receiver r = new Receiver("201");
                Sender s = Sender.builder(ds).url(target, r.url()).pollInterval(Duration.ofMinutes(1)).build()) {
            CompletableFuture<Void> worker = CompletableFuture.runAsync(() -> s.run(target, false, stop::get));
            Thread.sleep(500);
            prepared(ds, unique("order"), target, null);
            long deadline = System.nanoTime() + Duration.ofSeconds(10).toNanos();
            while (r.keys.isEmpty() && System.nanoTime() < deadline) {
                Thread.sleep(20);
            }
            assertEquals(1, r.keys.size(), "the worker did not wake up on the NOTIFY");
            stop.set(true);
            worker.get(5, java.util.concurrent.TimeUnit.SECONDS); // seen during its wait of a minute

        }
    }

    /** Logs, in a table of its own, each result recorded for target's sends: the operation and its transaction. */
    private static String recordings(PGSimpleDataSource ds, String target) throws SQLException {
        String table = "test_java_recorded_" + UUID.randomUUID().toString().replace("-", "");
        try (Connection c = ds.getConnection(); java.sql.Statement st = c.createStatement()) {
            st.execute("CREATE TABLE public." + table + " (n bigserial, xact xid8, operation text)");
            st.execute("CREATE FUNCTION public." + table + "_log() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                    + "INSERT INTO public." + table + " (xact, operation) VALUES (pg_current_xact_id(), NEW.operation); "
                    + "RETURN NEW; END $$");
            st.execute("CREATE TRIGGER " + table + " BEFORE UPDATE ON idempotency.outbound FOR EACH ROW WHEN "
                    + "(NEW.target = '" + target + "' AND NEW.state <> 'sending') EXECUTE FUNCTION public." + table
                    + "_log()");
        }
        return "public." + table;
    }

    /** The operations recorded, in order, then how many transactions recorded them. */
    private static List<String> recorded(PGSimpleDataSource ds, String table) throws SQLException {
        List<String> out = new ArrayList<>();
        try (Connection c = ds.getConnection(); java.sql.Statement st = c.createStatement()) {
            try (ResultSet rs = st.executeQuery("SELECT operation FROM " + table + " ORDER BY n")) {
                while (rs.next()) {
                    out.add(rs.getString(1));
                }
            }
            try (ResultSet rs = st.executeQuery("SELECT count(DISTINCT xact) FROM " + table)) {
                rs.next();
                out.add(rs.getInt(1) + " transactions");
            }
        }
        return out;
    }

    private static int suffixStatus(Sender.Attempt a) {
        return switch (a.operation().substring(a.operation().length() - 1)) {
            case "a" -> 503;
            case "b" -> 400;
            default -> 201;
        };
    }

    /**
     * A round of several sends has their answers recorded together: one statement, one transaction,
     * the rows in (scope, operation) order, under the sender's own settings (its backoff); a round of
     * one keeps the single call.
     */
    @Test
    void aRoundOfSeveralSendsIsRecordedTogether() throws Exception {
        PGSimpleDataSource ds = dataSource(null);
        String round = unique("round");
        String target = unique("t");
        String log = recordings(ds, target);
        List<String> finished = Collections.synchronizedList(new ArrayList<>());
        try (Sender s = Sender.builder(ds).concurrency(4).backoff(Duration.ofMillis(1), Duration.ofMillis(1))
                .send(a -> new Sender.Answer(suffixStatus(a), java.util.Map.of(), null, null))
                .onFinished((a, r) -> finished.add(a.operation())).build()) {
            for (String name : List.of("c", "a", "b")) {
                prepared(ds, round + "-" + name, target, null);
            }
            assertEquals(3, s.runOnce(target));
            assertEquals(List.of(round + "-a", round + "-b", round + "-c", "1 transactions"), recorded(ds, log));
            SendResult.NotYet a = assertInstanceOf(SendResult.NotYet.class, s.status("shop", round + "-a").orElseThrow());
            assertEquals("pending", a.state());
            assertEquals(1, a.attempts());
            try (Connection c = ds.getConnection(); PreparedStatement st = c.prepareStatement(
                    "SELECT next_attempt_at <= clock_timestamp() FROM idempotency.outbound"
                            + " WHERE scope = 'shop' AND operation = ?")) {
                st.setString(1, round + "-a");
                try (ResultSet rs = st.executeQuery()) {
                    rs.next();
                    assertTrue(rs.getBoolean(1), "the retry due within the sender's backoff cap (1 ms)");
                }
            }
            assertEquals(400, assertInstanceOf(SendResult.Delivered.class, s.status("shop", round + "-b").orElseThrow())
                    .status());
            assertEquals(201, assertInstanceOf(SendResult.Delivered.class, s.status("shop", round + "-c").orElseThrow())
                    .status());
            List<String> done = new ArrayList<>(finished);
            Collections.sort(done);
            assertEquals(List.of(round + "-b", round + "-c"), done);

            Thread.sleep(10); // a's retry, due within the cap: a round of one
            assertEquals(1, s.runOnce(target));
            assertEquals(List.of(round + "-a", round + "-b", round + "-c", round + "-a", "2 transactions"),
                    recorded(ds, log));
        }
    }

    /**
     * When the extension refuses one answer of a round the statement records none of them, and each
     * is recorded on its own. IK002: b's attempt outlives its lease and another session takes b over.
     */
    @Test
    void aRoundWithALostLeaseIsRecordedOneAtATime() throws Exception {
        PGSimpleDataSource ds = dataSource(null);
        String round = unique("lost");
        String target = unique("t");
        String log = recordings(ds, target);
        AtomicBoolean takenOver = new AtomicBoolean();
        List<SendResult> finished = Collections.synchronizedList(new ArrayList<>());
        Sender s = Sender.builder(ds).concurrency(4).timeout(Duration.ofMillis(100)).lease(Duration.ofMillis(300))
                .onFinished((a, r) -> finished.add(r)).send(a -> {
                    if (a.operation().endsWith("-b")) {
                        try (Connection c = ds.getConnection(); PreparedStatement st = c.prepareStatement(
                                "SELECT count(*) FROM idempotency.idem_send_next(scope => 'shop', operation => ?,"
                                        + " lease => '1 minute')")) {
                            Thread.sleep(500); // past the lease
                            st.setString(1, a.operation());
                            try (ResultSet rs = st.executeQuery()) {
                                rs.next();
                                takenOver.set(rs.getInt(1) == 1);
                            }
                        } catch (SQLException | InterruptedException e) {
                            throw new IllegalStateException(e);
                        }
                    }
                    return new Sender.Answer(201, java.util.Map.of(), null, null);
                }).build();
        try (s) {
            for (String name : List.of("a", "b", "c")) {
                prepared(ds, round + "-" + name, target, null);
            }
            assertEquals(3, s.runOnce(target));
            assertTrue(takenOver.get(), "b taken over by the other session");
            assertEquals(List.of(round + "-a", round + "-c", "2 transactions"), recorded(ds, log));
            assertEquals(2, finished.size());
            assertEquals("sending",
                    assertInstanceOf(SendResult.NotYet.class, s.status("shop", round + "-b").orElseThrow()).state());
            for (String name : List.of("a", "c")) {
                assertEquals(201, assertInstanceOf(SendResult.Delivered.class,
                        s.status("shop", round + "-" + name).orElseThrow()).status());
            }
        }
    }

    /**
     * IK003: b's answer was recorded already (from another session, with b's token: as when the
     * reply to the sender's COMMIT was lost); the round falls back to one at a time, b's result
     * read from its row.
     */
    @Test
    void aRoundWithAnAnswerRecordedAlreadyIsRecordedOneAtATime() throws Exception {
        PGSimpleDataSource ds = dataSource(null);
        String round = unique("recorded");
        String target = unique("t");
        String log = recordings(ds, target);
        Sender s = Sender.builder(ds).concurrency(4).send(a -> {
            int status = 201;
            if (a.operation().endsWith("-b")) {
                status = 202;
                try (Connection c = ds.getConnection(); PreparedStatement st = c.prepareStatement(
                        "SELECT state FROM idempotency.idem_send_result('shop', ?, ?::uuid, 202, NULL, '{}'::jsonb)")) {
                    st.setString(1, a.operation());
                    st.setString(2, a.token().toString());
                    st.executeQuery().close();
                } catch (SQLException e) {
                    throw new IllegalStateException(e);
                }
            }
            return new Sender.Answer(status, java.util.Map.of(), null, null);
        }).build();
        try (s) {
            for (String name : List.of("a", "b", "c")) {
                prepared(ds, round + "-" + name, target, null);
            }
            assertEquals(3, s.runOnce(target));
            assertEquals(List.of(round + "-b", round + "-a", round + "-c", "3 transactions"), recorded(ds, log));
            for (String name : List.of("a", "b", "c")) {
                SendResult.Delivered d = assertInstanceOf(SendResult.Delivered.class,
                        s.status("shop", round + "-" + name).orElseThrow());
                assertEquals(name.equals("b") ? 202 : 201, d.status());
            }
        }
    }
}
