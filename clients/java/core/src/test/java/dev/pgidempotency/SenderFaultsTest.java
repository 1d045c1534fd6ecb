package dev.pgidempotency;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import com.sun.net.httpserver.HttpServer;
import com.zaxxer.hikari.HikariConfig;
import com.zaxxer.hikari.HikariDataSource;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;
import java.util.logging.Handler;
import java.util.logging.LogRecord;
import java.util.logging.Logger;
import org.junit.jupiter.api.Test;
import org.postgresql.ds.PGSimpleDataSource;

/**
 * The sender's worker outlives its database (issue 32), its attempts are bounded in total time,
 * and its own settings hold: real servers, real sessions, a real HTTP receiver. Its backends
 * terminated, the server stopped and started again under it ($JAVA_PG_CTL: connection refused
 * meanwhile), a real deadlock, a serialization failure: the worker logs each error (System.Logger
 * dev.pgidempotency.Sender, here through java.util.logging), reconnects and goes on; the answer
 * of an attempt in flight is recorded after reconnecting while its lease holds, and is otherwise
 * left to be taken again.
 */
class SenderFaultsTest {
    /** The application_name of the senders' sessions here: only they are terminated. */
    private static final String APP = "idem-sender-faults";
    private static final AtomicInteger NEXT = new AtomicInteger();

    /** A receiver at /charges: holds each answer until released (when told to), or trickles it. */
    static final class Receiver implements AutoCloseable {
        final HttpServer server;
        final List<String> keys = Collections.synchronizedList(new ArrayList<>());
        final CountDownLatch arrived = new CountDownLatch(1);
        final CountDownLatch release = new CountDownLatch(1);
        /** When the sender closed a trickled answer, in ms after its request came; -1 while open. */
        final List<Long> closedAfterMs = Collections.synchronizedList(new ArrayList<>());
        private final boolean hold;
        private final int status;
        private final long trickleMs;

        Receiver(int status, boolean hold, long trickleMs) throws IOException {
            this.status = status;
            this.hold = hold;
            this.trickleMs = trickleMs;
            server = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
            server.setExecutor(Executors.newCachedThreadPool());
            server.createContext("/charges", ex -> {
                long began = System.nanoTime();
                ex.getRequestBody().readAllBytes();
                keys.add(ex.getRequestHeaders().getFirst("Idempotency-Key"));
                arrived.countDown();
                if (this.hold) {
                    try {
                        release.await(60, TimeUnit.SECONDS);
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                    }
                }
                byte[] body = "{\"ok\": true, \"padding\": \"............\"}".getBytes(StandardCharsets.UTF_8);
                ex.getResponseHeaders().add("Content-Type", "application/json");
                ex.sendResponseHeaders(this.status, body.length);
                try (OutputStream out = ex.getResponseBody()) {
                    if (this.trickleMs <= 0) {
                        out.write(body);
                        return;
                    }
                    for (byte b : body) {
                        out.write(b);
                        out.flush();
                        Thread.sleep(this.trickleMs);
                    }
                } catch (IOException e) {
                    closedAfterMs.add(TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - began));
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                } finally {
                    ex.close();
                }
            });
            server.start();
        }

        static Receiver answering(int status) throws IOException {
            return new Receiver(status, false, 0);
        }

        static Receiver holding() throws IOException {
            return new Receiver(201, true, 0);
        }

        String url() {
            return "http://127.0.0.1:" + server.getAddress().getPort() + "/charges";
        }

        @Override
        public void close() {
            release.countDown();
            server.stop(0);
        }
    }

    /** The sender's log records (java.util.logging, where System.Logger goes by default). */
    static final class SenderLog extends Handler implements AutoCloseable {
        private final Logger logger = Logger.getLogger(Sender.LOGGER); // held: JUL keeps loggers weakly
        final List<LogRecord> records = Collections.synchronizedList(new ArrayList<>());

        SenderLog() {
            logger.addHandler(this);
        }

        @Override
        public void publish(LogRecord r) {
            records.add(r);
        }

        List<String> dbErrors() {
            List<String> out = new ArrayList<>();
            for (LogRecord r : List.copyOf(records)) {
                if (r.getThrown() instanceof SQLException e) {
                    out.add(Sender.errorCode(e));
                    assertEquals(java.util.logging.Level.WARNING, r.getLevel());
                }
            }
            return out;
        }

        long reconnections() {
            return List.copyOf(records).stream().filter(r -> Sender.RECONNECTED.equals(r.getMessage())).count();
        }

        String messages() {
            java.util.logging.Formatter f = new java.util.logging.SimpleFormatter();
            StringBuilder b = new StringBuilder();
            for (LogRecord r : List.copyOf(records)) {
                b.append(f.formatMessage(r)).append('\n');
            }
            return b.toString();
        }

        @Override
        public void flush() {}

        @Override
        public void close() {
            logger.removeHandler(this);
        }
    }

    /** Sender.run in a thread; {@link #finish} stops it and checks that it had not ended before. */
    static final class Worker {
        final AtomicBoolean stop = new AtomicBoolean();
        final List<Throwable> raised = Collections.synchronizedList(new ArrayList<>());
        final Thread thread;

        Worker(Sender s, String target) {
            thread = new Thread(() -> {
                try {
                    s.run(target, false, stop::get);
                } catch (RuntimeException | Error e) {
                    raised.add(e);
                }
            }, "test-worker");
            thread.start();
        }

        boolean alive() {
            return thread.isAlive();
        }

        void finish() throws InterruptedException {
            assertTrue(alive() && raised.isEmpty(), "the worker ended before its stop: " + raised);
            stop.set(true);
            thread.join(30_000);
            assertFalse(thread.isAlive());
            assertTrue(raised.isEmpty(), raised.toString());
        }
    }

    private static String url() {
        return Databases.url("DATABASE_URL");
    }

    private static String newOp(String name) {
        return name + "-" + System.nanoTime() + "-" + NEXT.incrementAndGet() + ":charge";
    }

    /** A pool as applications use one, its sessions named APP; connection timeout 1 s, so that waits while the server is down end. */
    private static HikariDataSource pool() {
        HikariConfig c = new HikariConfig();
        c.setJdbcUrl(url() + "&ApplicationName=" + APP);
        c.setMaximumPoolSize(4);
        c.setConnectionTimeout(1000);
        c.setInitializationFailTimeout(-1);
        return new HikariDataSource(c);
    }

    private static Sender.Builder fast(HikariDataSource ds, Receiver r, String target) {
        return Sender.builder(ds).url(target, r.url()).backoff(Duration.ofMillis(50), Duration.ofMillis(200))
                .reconnectBackoff(Duration.ofMillis(50), Duration.ofMillis(500)).pollInterval(Duration.ofMillis(200));
    }

    private static void prepared(String op, String target) throws SQLException {
        try (Connection c = DriverManager.getConnection(url())) {
            c.setAutoCommit(false);
            Sender.prepare(c, "shop", op, target, "{\"amount\": 1}", null, null);
            c.commit();
        }
    }

    /** (state, attempts) of the send, from another session. */
    private static String state(String op) throws SQLException {
        try (Connection c = DriverManager.getConnection(url());
                PreparedStatement st = c.prepareStatement("SELECT state || ' ' || attempts FROM idempotency.outbound WHERE operation = ?")) {
            st.setString(1, op);
            try (ResultSet rs = st.executeQuery()) {
                return rs.next() ? rs.getString(1) : null;
            }
        } catch (SQLException e) {
            return "unreadable: " + e.getSQLState();
        }
    }

    private static boolean waitUntil(BooleanSupplier what, int seconds) throws InterruptedException {
        long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(seconds);
        while (System.nanoTime() < end) {
            if (what.getAsBoolean()) {
                return true;
            }
            Thread.sleep(50);
        }
        return what.getAsBoolean();
    }

    private static boolean done(String op) {
        try {
            String s = state(op);
            return s != null && s.startsWith("done ");
        } catch (SQLException e) {
            return false;
        }
    }

    /** pg_ctl on the tests' server (clients/java/test.sh writes the script). */
    private static void pgCtl(String... args) throws IOException, InterruptedException {
        String script = System.getenv("JAVA_PG_CTL");
        assumeTrue(script != null && !script.isEmpty(), "JAVA_PG_CTL is not set: clients/java/test.sh writes it");
        List<String> cmd = new ArrayList<>(List.of(script));
        cmd.addAll(List.of(args));
        Process p = new ProcessBuilder(cmd).inheritIO().start();
        assertTrue(p.waitFor(90, TimeUnit.SECONDS) && p.exitValue() == 0, "pg_ctl " + String.join(" ", args));
    }

    @Test
    void backendsTerminatedTheWorkerReconnectsAndRecordsTheAnswer() throws Exception {
        String target = "t-terminated-" + NEXT.incrementAndGet();
        String op = newOp("terminated");
        String then = newOp("terminated-then");
        prepared(op, target);
        try (Receiver r = Receiver.holding(); HikariDataSource ds = pool(); SenderLog log = new SenderLog();
                Sender s = fast(ds, r, target).lease(Duration.ofSeconds(10)).timeout(Duration.ofSeconds(5)).build()) {
            Worker w = new Worker(s, target);
            try {
                assertTrue(r.arrived.await(20, TimeUnit.SECONDS));
                int terminated;
                try (Connection c = DriverManager.getConnection(url()); ResultSet rs = c.createStatement().executeQuery(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = '" + APP + "'")) {
                    rs.next();
                    terminated = rs.getInt(1);
                }
                assertTrue(terminated >= 1, "its sessions: the LISTEN one and the pool's");
                r.release.countDown();
                assertTrue(waitUntil(() -> done(op), 30), state(op));
                prepared(then, target); // and it goes on
                assertTrue(waitUntil(() -> done(then), 30), state(then));
            } finally {
                w.finish();
            }
            assertEquals("done 1", state(op), "recorded once, not taken again");
            assertEquals(2, r.keys.size());
            String first = log.dbErrors().get(0);
            assertTrue(first.equals("57P01") || first.startsWith("08"), log.dbErrors().toString());
            assertTrue(log.reconnections() >= 1, log.messages());
        }
    }

    /**
     * Stopped while an attempt is in flight, down for a second and a half (connection refused, again
     * and again), started again: the worker lived through it and recorded the answer it got
     * meanwhile (its lease of 10 s still held).
     */
    @Test
    void theServerRestartedUnderTheWorker() throws Exception {
        String target = "t-restart-" + NEXT.incrementAndGet();
        String op = newOp("restart");
        String then = newOp("restart-then");
        prepared(op, target);
        int whileDown;
        try (Receiver r = Receiver.holding(); HikariDataSource ds = pool(); SenderLog log = new SenderLog();
                Sender s = fast(ds, r, target).lease(Duration.ofSeconds(10)).timeout(Duration.ofSeconds(5)).build()) {
            Worker w = new Worker(s, target);
            try {
                assertTrue(r.arrived.await(20, TimeUnit.SECONDS));
                pgCtl("stop", "-m", "fast");
                try {
                    r.release.countDown();
                    Thread.sleep(2500);
                    assertTrue(w.alive());
                    whileDown = log.dbErrors().size();
                } finally {
                    pgCtl("start");
                }
                assertTrue(waitUntil(() -> done(op), 30), state(op));
                prepared(then, target);
                assertTrue(waitUntil(() -> done(then), 30), state(then));
            } finally {
                w.finish();
            }
            assertTrue(whileDown >= 2, "the shutdown and the refused connections after it: " + log.dbErrors());
            assertTrue(log.dbErrors().contains("08001"), "a connection refused (the pool's timeout, 08001): " + log.dbErrors());
            assertTrue(log.reconnections() >= 1, log.messages());
            assertTrue(log.messages().contains("recorded the answer to shop / " + op + " (attempt 1) after reconnecting"),
                    log.messages());
            assertEquals("done 1", state(op));
            assertEquals(2, r.keys.size());
        }
    }

    /**
     * The answer came while the server was down, and the lease (2 s) ended before it was back: the
     * answer is dropped, not recorded late, and the send is taken again (attempt 2, the same key).
     */
    @Test
    void downLongerThanTheLeaseTheSendIsTakenAgain() throws Exception {
        String target = "t-lease-ended-" + NEXT.incrementAndGet();
        String op = newOp("lease-ended");
        prepared(op, target);
        try (Receiver r = Receiver.holding(); HikariDataSource ds = pool(); SenderLog log = new SenderLog();
                Sender s = fast(ds, r, target).lease(Duration.ofSeconds(2)).timeout(Duration.ofMillis(1500)).build()) {
            Worker w = new Worker(s, target);
            try {
                assertTrue(r.arrived.await(20, TimeUnit.SECONDS));
                pgCtl("stop", "-m", "fast");
                try {
                    r.release.countDown();
                    Thread.sleep(2500);
                } finally {
                    pgCtl("start");
                }
                assertTrue(waitUntil(() -> done(op), 30), state(op));
            } finally {
                w.finish();
            }
            assertEquals("done 2", state(op));
            assertEquals(2, r.keys.size());
            assertEquals(1, Set.copyOf(r.keys).size(), "one key");
            assertTrue(log.messages().contains("the answer to shop / " + op
                    + " (attempt 1) was not recorded before its lease ended"), log.messages());
        }
    }

    @FunctionalInterface
    private interface Drop {
        void drop() throws SQLException;
    }

    /** A BEFORE UPDATE trigger on idempotency.outbound for one target (the recording of a result); returns its drop. */
    private static Drop trigger(String target, String body) throws SQLException {
        String name = "test_sender_" + target.replace('-', '_');
        try (Connection c = DriverManager.getConnection(url()); Statement st = c.createStatement()) {
            st.execute("CREATE FUNCTION public." + name + "() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN " + body
                    + " RETURN NEW; END $$");
            st.execute("CREATE TRIGGER " + name + " BEFORE UPDATE ON idempotency.outbound FOR EACH ROW WHEN (NEW.target = '"
                    + target + "' AND NEW.state <> 'sending') EXECUTE FUNCTION public." + name + "()");
        }
        return () -> {
            try (Connection c = DriverManager.getConnection(url()); Statement st = c.createStatement()) {
                st.execute("DROP TRIGGER " + name + " ON idempotency.outbound");
                st.execute("DROP FUNCTION public." + name + "()");
                st.execute("DROP SEQUENCE IF EXISTS public." + name + "_seq");
            }
        };
    }

    /**
     * A real deadlock: the sender's recording holds the send's row and waits for an advisory lock
     * (this test's trigger takes it) that another session holds, which then asks for the row.
     * PostgreSQL's deadlock detector aborts the sender's transaction (its deadlock_timeout, 1 s, is
     * the shorter); the worker goes on and records the answer.
     */
    @Test
    void aDeadlockWhileRecording() throws Exception {
        String target = "t-deadlock-" + NEXT.incrementAndGet();
        String op = newOp("deadlock");
        prepared(op, target);
        Drop dropTrigger = trigger(target, "PERFORM pg_advisory_xact_lock(4242);");
        try (Receiver r = Receiver.answering(201); HikariDataSource ds = pool(); SenderLog log = new SenderLog();
                Connection holder = DriverManager.getConnection(url());
                Sender s = fast(ds, r, target).lease(Duration.ofSeconds(20)).timeout(Duration.ofSeconds(5)).build()) {
            holder.setAutoCommit(false);
            try (Statement st = holder.createStatement()) {
                st.execute("SET LOCAL deadlock_timeout = '30s'");
                st.execute("SELECT pg_advisory_xact_lock(4242)");
            }
            Worker w = new Worker(s, target);
            try {
                try (Connection c = DriverManager.getConnection(url())) {
                    assertTrue(waitUntil(() -> count(c, "SELECT count(*) FROM pg_stat_activity WHERE application_name = '"
                            + APP + "' AND wait_event = 'advisory'") == 1, 30), "the recording waits for the advisory lock");
                }
                try (PreparedStatement st = holder.prepareStatement(
                        "SELECT 1 FROM idempotency.outbound WHERE operation = ? FOR UPDATE")) {
                    st.setString(1, op);
                    st.executeQuery().close();
                }
                holder.rollback();
                assertTrue(waitUntil(() -> done(op), 30), state(op));
            } finally {
                w.finish();
            }
            assertTrue(log.dbErrors().contains("40P01"), log.dbErrors().toString());
            assertTrue(log.reconnections() >= 1, log.messages());
            assertEquals("done 1", state(op));
            assertEquals(1, r.keys.size());
        } finally {
            dropTrigger.drop();
        }
    }

    private static int count(Connection c, String sql) {
        try (ResultSet rs = c.createStatement().executeQuery(sql)) {
            rs.next();
            return rs.getInt(1);
        } catch (SQLException e) {
            return -1;
        }
    }

    /** 40001, raised once by this test's trigger (a function of the application's meets it in READ COMMITTED too). */
    @Test
    void aSerializationFailureWhileRecording() throws Exception {
        String target = "t-serialization-" + NEXT.incrementAndGet();
        String seq = "test_sender_" + target.replace('-', '_') + "_seq";
        String op = newOp("serialization");
        prepared(op, target);
        try (Connection c = DriverManager.getConnection(url()); Statement st = c.createStatement()) {
            st.execute("CREATE SEQUENCE public." + seq);
        }
        Drop dropTrigger = trigger(target, "IF nextval('public." + seq + "') = 1 THEN RAISE EXCEPTION "
                + "'could not serialize access (this test)' USING ERRCODE = 'serialization_failure'; END IF;");
        try (Receiver r = Receiver.answering(201); HikariDataSource ds = pool(); SenderLog log = new SenderLog();
                Sender s = fast(ds, r, target).lease(Duration.ofSeconds(10)).timeout(Duration.ofSeconds(5)).build()) {
            Worker w = new Worker(s, target);
            try {
                assertTrue(waitUntil(() -> done(op), 30), state(op));
            } finally {
                w.finish();
            }
            assertEquals(List.of("40001"), log.dbErrors());
            assertEquals(1, log.reconnections());
            assertEquals("done 1", state(op));
            assertEquals(1, r.keys.size());
        } finally {
            dropTrigger.drop();
        }
    }

    /**
     * The timeout bounds an attempt in total: an answer whose body comes a byte every 200 ms (no
     * socket read waits long enough for a per-read timeout) is given up on after the timeout
     * (1 s), its connection closed by the sender, before the lease (3 s) ends.
     */
    @Test
    void anAttemptIsBoundedInTotalByTheTimeout() throws Exception {
        String target = "t-trickle-" + NEXT.incrementAndGet();
        String op = newOp("trickle");
        prepared(op, target);
        PGSimpleDataSource ds = new PGSimpleDataSource();
        ds.setURL(url());
        try (Receiver r = new Receiver(201, false, 200);
                Sender s = Sender.builder(ds).url(target, r.url()).timeout(Duration.ofSeconds(1)).lease(Duration.ofSeconds(3))
                        .build()) {
            long began = System.nanoTime();
            SendResult.NotYet ny = assertInstanceOf(SendResult.NotYet.class, s.deliver("shop", op));
            long tookMs = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - began);
            assertEquals("timed out after 1000 ms", ny.lastError());
            assertTrue(tookMs < 1750, "the attempt took " + tookMs + " ms");
            assertTrue(waitUntil(() -> !r.closedAfterMs.isEmpty(), 5), "the receiver saw the connection closed");
            assertTrue(r.closedAfterMs.get(0) < 1750, "closed " + r.closedAfterMs.get(0) + " ms after the request");
        }
    }

    /** The sender's give_up_after is idem_send's, unless prepare is given one. */
    @Test
    void theSendersGiveUpAfter() throws Exception {
        String op = newOp("give-up-90");
        String other = newOp("give-up-30");
        PGSimpleDataSource ds = new PGSimpleDataSource();
        ds.setURL(url());
        try (Sender s = Sender.builder(ds).url("t", "http://127.0.0.1:9/").giveUpAfter(Duration.ofSeconds(90)).build();
                Connection c = ds.getConnection()) {
            c.setAutoCommit(false);
            s.prepare(c, "shop", op, "t-give-up-after", "{}");
            Sender.prepare(c, "shop", other, "t-give-up-after", "{}", null, Duration.ofSeconds(30));
            c.commit();
            try (PreparedStatement st = c.prepareStatement("SELECT extract(epoch FROM give_up_at - created_at)::int"
                    + " FROM idempotency.outbound WHERE operation = ?")) {
                for (String[] want : new String[][] {{op, "90"}, {other, "30"}}) {
                    st.setString(1, want[0]);
                    try (ResultSet rs = st.executeQuery()) {
                        rs.next();
                        assertEquals(want[1], rs.getString(1), want[0]);
                    }
                }
            }
            c.commit();
        }
    }

    /**
     * Two senders through PgBouncer (transaction pooling) with their own budget and backoff: 12
     * first attempts answered 503, each retry due within the senders' cap (1 ms; the database's is
     * 1 s); the sender with budget 0 hands out no retry, the one with budget 6 all 12
     * (floor((6 x 12 + 10) / 6) = 13 over the window's last sixth); no other
     * transaction sees their values (set_config(..., true)).
     */
    @Test
    void budgetAndBackoffOfTheSenderPerTransactionThroughPgBouncer() throws Exception {
        String bounced = Databases.url("PGBOUNCER_URL");
        String target = "t-budget-" + System.nanoTime();
        List<String> ops = new ArrayList<>();
        for (int i = 0; i < 12; i++) {
            ops.add(newOp("budget-" + i));
            prepared(ops.get(i), target);
        }
        PGSimpleDataSource ds = new PGSimpleDataSource();
        ds.setURL(bounced);
        Duration tiny = Duration.ofMillis(1);
        try (Receiver r = Receiver.answering(503);
                Sender none = Sender.builder(ds).url(target, r.url()).timeout(Duration.ofSeconds(2)).lease(Duration.ofSeconds(5))
                        .concurrency(50).retryBudget(0.0).backoff(tiny, tiny).build();
                Sender some = Sender.builder(ds).url(target, r.url()).timeout(Duration.ofSeconds(2)).lease(Duration.ofSeconds(5))
                        .concurrency(50).retryBudget(6.0).backoff(tiny, tiny).build();
                Connection c = DriverManager.getConnection(url())) {
            java.time.OffsetDateTime before = clock(c);
            assertEquals(12, none.runOnce(target), "first attempts are never held back");
            java.time.OffsetDateTime after = clock(c);
            try (PreparedStatement st = c.prepareStatement("SELECT next_attempt_at FROM idempotency.outbound WHERE target = ?")) {
                st.setString(1, target);
                try (ResultSet rs = st.executeQuery()) {
                    int n = 0;
                    while (rs.next()) {
                        java.time.OffsetDateTime due = rs.getObject(1, java.time.OffsetDateTime.class);
                        assertTrue(!due.isBefore(before) && !due.isAfter(after.plus(tiny)), before + " " + due + " " + after);
                        n++;
                    }
                    assertEquals(12, n);
                }
            }
            Thread.sleep(50);
            assertEquals(0, none.runOnce(target), "budget 0: no retries, though 12 are due");
            assertEquals(12, some.runOnce(target), "budget 6: (6 x 12 first attempts + 10) / 6 >= 12");
            assertEquals(24, r.keys.size());
        }
        try (Connection b = DriverManager.getConnection(bounced)) {
            for (int i = 0; i < 5; i++) { // whichever server connection PgBouncer hands out
                try (ResultSet rs = b.createStatement().executeQuery("SELECT current_setting('idempotency.send_retry_budget', true),"
                        + " current_setting('idempotency.send_backoff_cap', true)")) {
                    rs.next();
                    assertNotEquals("0", rs.getString(1));
                    assertNotEquals("1", rs.getString(1));
                    assertNotEquals("1ms", rs.getString(2));
                }
            }
        }
    }

    private static java.time.OffsetDateTime clock(Connection c) throws SQLException {
        try (ResultSet rs = c.createStatement().executeQuery("SELECT clock_timestamp()")) {
            rs.next();
            return rs.getObject(1, java.time.OffsetDateTime.class);
        }
    }
}
