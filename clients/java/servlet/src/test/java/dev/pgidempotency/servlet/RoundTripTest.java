package dev.pgidempotency.servlet;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import dev.pgidempotency.DatabaseUrl;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.PrintWriter;
import java.lang.reflect.InvocationTargetException;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.SQLFeatureNotSupportedException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.logging.Logger;
import javax.sql.DataSource;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * Round trips to PostgreSQL per request, counted on the wire: the filter's one connection goes
 * through a TCP proxy that reads the protocol and counts the times the client starts sending while
 * it has no answer pending (every Query and Sync it sent was answered by a ReadyForQuery); messages
 * sent before their Sync, or before the earlier ones were answered, belong to the same trip. The
 * proxy can hold round trips back, to show that an answer which writes nothing goes out before its
 * ROLLBACK.
 */
class RoundTripTest {
    private final HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(5)).build();

    /** The counting proxy in front of the server. */
    static final class TripProxy implements AutoCloseable {
        private final ServerSocket listener;
        private int trips;
        private int holdAfter = -1;
        private final List<String> statements = new ArrayList<>();

        TripProxy(String host, int port) throws IOException {
            listener = new ServerSocket(0, 50, InetAddress.getLoopbackAddress());
            Thread accept = new Thread(() -> {
                while (!listener.isClosed()) {
                    try {
                        Socket client = listener.accept();
                        Socket server = new Socket(host, port);
                        AtomicInteger pending = new AtomicInteger();
                        start(() -> frontend(client, server, pending));
                        start(() -> backend(server, client, pending));
                    } catch (IOException e) {
                        return;
                    }
                }
            });
            accept.setDaemon(true);
            accept.start();
        }

        int port() {
            return listener.getLocalPort();
        }

        private static void start(Runnable r) {
            Thread t = new Thread(r);
            t.setDaemon(true);
            t.start();
        }

        synchronized void reset(int holdAfter) {
            trips = 0;
            statements.clear();
            this.holdAfter = holdAfter;
        }

        /** The SQL text of every Parse and Query message since the last reset. */
        synchronized List<String> statements() {
            return List.copyOf(statements);
        }

        private synchronized void sawStatement(byte[] m) {
            int from = m[0] == 'P' ? indexOfZero(m, 5) + 1 : 5; // Parse: the statement's name first
            statements.add(new String(m, from, indexOfZero(m, from) - from, StandardCharsets.UTF_8));
        }

        private static int indexOfZero(byte[] m, int from) {
            int i = from;
            while (m[i] != 0) {
                i++;
            }
            return i;
        }

        synchronized void release() {
            holdAfter = -1;
            notifyAll();
        }

        synchronized int trips() {
            return trips;
        }

        /** Counts a trip that starts now; waits while it is held. */
        private synchronized void startTrip() throws InterruptedException {
            trips++;
            while (holdAfter >= 0 && trips > holdAfter) {
                wait();
            }
        }

        /** Reads one message: type byte (none for the startup message) and its length-prefixed body. */
        private static byte[] read(InputStream in, boolean typed) throws IOException {
            byte[] head = in.readNBytes(typed ? 5 : 4);
            if (head.length < (typed ? 5 : 4)) {
                return null;
            }
            int at = typed ? 1 : 0;
            int len = ((head[at] & 0xff) << 24) | ((head[at + 1] & 0xff) << 16) | ((head[at + 2] & 0xff) << 8) | (head[at + 3] & 0xff);
            byte[] rest = in.readNBytes(len - 4);
            byte[] all = Arrays.copyOf(head, head.length + rest.length);
            System.arraycopy(rest, 0, all, head.length, rest.length);
            return all;
        }

        private void frontend(Socket client, Socket server, AtomicInteger pending) {
            try (client; server) {
                InputStream in = client.getInputStream();
                OutputStream out = server.getOutputStream();
                byte[] startup = read(in, false);
                if (startup == null) {
                    return;
                }
                pending.incrementAndGet(); // the startup is answered by a ReadyForQuery too
                out.write(startup);
                boolean composing = false;
                byte[] m;
                while ((m = read(in, true)) != null) {
                    char kind = (char) m[0];
                    if (pending.get() == 0 && !composing && kind != 'X') {
                        startTrip();
                    }
                    if (kind == 'P' || kind == 'Q') {
                        sawStatement(m);
                    }
                    composing = kind != 'Q' && kind != 'S';
                    if (!composing) {
                        pending.incrementAndGet();
                    }
                    out.write(m);
                }
            } catch (IOException | InterruptedException e) {
                // the connection ended
            }
        }

        private static void backend(Socket server, Socket client, AtomicInteger pending) {
            try (server; client) {
                InputStream in = server.getInputStream();
                OutputStream out = client.getOutputStream();
                byte[] m;
                while ((m = read(in, true)) != null) {
                    if (m[0] == 'Z') {
                        pending.decrementAndGet();
                    }
                    out.write(m);
                }
            } catch (IOException e) {
                // the connection ended
            }
        }

        @Override
        public void close() throws IOException {
            release();
            listener.close();
        }
    }

    /**
     * One connection, handed out again and again (close gives it back): every statement of a
     * request goes through it, and it is back only once the filter has closed it.
     */
    static final class OneConnection implements DataSource {
        private final Connection real;
        private boolean lent;

        OneConnection(Connection real) {
            this.real = real;
        }

        @Override
        public synchronized Connection getConnection() throws SQLException {
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
            while (lent) {
                long left = deadline - System.nanoTime();
                if (left <= 0) {
                    throw new java.sql.SQLTransientConnectionException("the one connection is still lent");
                }
                try {
                    TimeUnit.NANOSECONDS.timedWait(this, left);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new SQLException(e);
                }
            }
            lent = true;
            return (Connection) java.lang.reflect.Proxy.newProxyInstance(Connection.class.getClassLoader(),
                    new Class<?>[] {Connection.class}, (proxy, method, args) -> {
                        if (method.getName().equals("close")) {
                            giveBack();
                            return null;
                        }
                        try {
                            return method.invoke(real, args);
                        } catch (InvocationTargetException e) {
                            throw e.getCause();
                        }
                    });
        }

        private synchronized void giveBack() {
            lent = false;
            notifyAll();
        }

        /** Waits until the connection is back (after a ROLLBACK sent behind the answer). */
        synchronized void awaitReturned() throws InterruptedException {
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
            while (lent) {
                long left = deadline - System.nanoTime();
                assertTrue(left > 0, "the connection did not come back");
                TimeUnit.NANOSECONDS.timedWait(this, left);
            }
        }

        @Override
        public Connection getConnection(String user, String password) throws SQLException {
            throw new SQLFeatureNotSupportedException();
        }

        @Override
        public PrintWriter getLogWriter() {
            return null;
        }

        @Override
        public void setLogWriter(PrintWriter out) {}

        @Override
        public void setLoginTimeout(int seconds) {}

        @Override
        public int getLoginTimeout() {
            return 0;
        }

        @Override
        public Logger getParentLogger() throws SQLFeatureNotSupportedException {
            throw new SQLFeatureNotSupportedException();
        }

        @Override
        public <T> T unwrap(Class<T> iface) throws SQLException {
            throw new SQLException("not a wrapper");
        }

        @Override
        public boolean isWrapperFor(Class<?> iface) {
            return false;
        }
    }

    private record Counted(HttpResponse<byte[]> answer, int trips, List<String> statements) {
        String claim() {
            return statements.stream().filter(q -> q.contains("idem_claim(")).findFirst().orElse("(no idem_claim)");
        }
    }

    /** One request with the round trips after the first {@code holdAfter} held (-1: none); the answer must come while they are held. */
    private Counted counted(TripProxy proxy, OneConnection ds, int port, String path, String key, String body, int holdAfter)
            throws Exception {
        ds.awaitReturned();
        proxy.reset(holdAfter);
        CompletableFuture<HttpResponse<byte[]>> sent = http.sendAsync(request(port, path, key, body).build(),
                HttpResponse.BodyHandlers.ofByteArray());
        HttpResponse<byte[]> answer;
        try {
            answer = sent.get(10, TimeUnit.SECONDS);
        } catch (TimeoutException e) {
            proxy.release();
            return fail("no answer while the round trips after the first " + holdAfter + " were held; trips so far " + proxy.trips() + ": " + proxy.statements());
        } finally {
            proxy.release();
        }
        ds.awaitReturned();
        return new Counted(answer, proxy.trips(), proxy.statements());
    }

    private static HttpRequest.Builder request(int port, String path, String key, String body) {
        return HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + path))
                .timeout(Duration.ofSeconds(30)).header("Content-Type", "application/json")
                .header("X-Api-Key", "round-trips").header("Idempotency-Key", "\"" + key + "\"")
                .POST(HttpRequest.BodyPublishers.ofString(body));
    }

    private static boolean replayed(HttpResponse<?> r) {
        return "true".equals(r.headers().firstValue("Idempotent-Replayed").orElse(null));
    }

    /** The record of (POST PATH, key), as another connection sees it: its status, or null. */
    private static String recordStatus(Connection observer, String path, String key) throws SQLException {
        try (PreparedStatement st = observer.prepareStatement(
                "SELECT status::text FROM idempotency.keys WHERE scope = ? AND key = ?")) {
            st.setString(1, "POST " + path);
            st.setString(2, key);
            try (ResultSet rs = st.executeQuery()) {
                return rs.next() ? rs.getString(1) : null;
            }
        }
    }

    @FunctionalInterface
    private interface Probe {
        void run() throws Exception;
    }

    /** Sends a request whose handler sleeps 1.5 s before its INSERT, and runs {@code during} meanwhile. */
    private void whileTheHandlerSleeps(OneConnection ds, int port, String path, String key, Probe during) throws Exception {
        ds.awaitReturned();
        CompletableFuture<HttpResponse<byte[]>> sent = http.sendAsync(
                request(port, path, key, "{}").header("X-Test-Sleep-Ms", "1500").build(),
                HttpResponse.BodyHandlers.ofByteArray());
        Thread.sleep(500);
        during.run();
        HttpResponse<byte[]> answer = sent.get(30, TimeUnit.SECONDS);
        assertEquals(201, answer.statusCode(), () -> new String(answer.body()));
    }

    /**
     * Deferred (extension 0.6.0): while the handler runs, the claim's session holds the key's lock
     * (advisory, objsubid 7649) but has no transaction id, so it has written nothing, no in_progress
     * row (an uncommitted row would be invisible to another connection as well: the transaction id
     * is what tells). After the complete, the completed record is there.
     */
    private void theSameTransactionClaimWritesNothingBeforeTheComplete(Connection observer, OneConnection ds, int port)
            throws Exception {
        String key = UUID.randomUUID().toString();
        whileTheHandlerSleeps(ds, port, "/tx", key, () -> {
            assertNull(recordStatus(observer, "/tx", key), "no record before the complete");
            try (ResultSet rs = observer.createStatement().executeQuery("""
                    SELECT a.backend_xid IS NULL, a.state FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
                    WHERE l.locktype = 'advisory' AND l.objsubid = 7649 AND l.granted AND l.database = a.datid""")) {
                assertTrue(rs.next(), "the claim's session holds the key lock");
                assertTrue(rs.getBoolean(1), "the claim's session has no transaction id: it wrote nothing");
                assertEquals("idle in transaction", rs.getString(2));
                assertFalse(rs.next(), "one key lock");
            }
        });
        assertEquals("completed", recordStatus(observer, "/tx", key));
    }

    /** Committed first is not deferred: its in_progress record is committed before the handler runs. */
    private void theCommittedFirstClaimIsThereAtOnce(Connection observer, OneConnection ds, int port) throws Exception {
        String key = UUID.randomUUID().toString();
        whileTheHandlerSleeps(ds, port, "/ext", key,
                () -> assertEquals("in_progress", recordStatus(observer, "/ext", key)));
        assertEquals("completed", recordStatus(observer, "/ext", key));
    }

    /** Against the server, and through PgBouncer in transaction pooling mode. */
    @ParameterizedTest
    @ValueSource(strings = {"DATABASE_URL", "PGBOUNCER_URL"})
    void sameTransactionAndCommittedFirst(String database) throws Exception {
        String url = System.getenv(database);
        assumeTrue(url != null && !url.isEmpty(), database + " is not set: clients/java/test.sh starts the server and PgBouncer");
        URI u = URI.create(url);
        try (TripProxy proxy = new TripProxy(u.getHost(), u.getPort())) {
            // In clear (the proxy reads the protocol): no SSLRequest, no GSSENCRequest.
            String query = (u.getQuery() == null ? "" : u.getQuery() + "&") + "sslmode=disable&gssEncMode=disable";
            String jdbc = DatabaseUrl.toJdbc(new URI(u.getScheme(), u.getUserInfo(), "127.0.0.1", proxy.port(), u.getPath(),
                    query, null).toString());
            try (Connection real = DriverManager.getConnection(jdbc)) {
                OneConnection ds = new OneConnection(real);
                TestApp.createTable(ds);
                IdempotencyFilter filter = IdempotencyFilter.builder(ds)
                        .route("POST", "/tx", RouteOptions.DEFAULTS)
                        .route("POST", "/ext", RouteOptions.DEFAULTS.withMode(Mode.COMMITTED_FIRST).withLease(Duration.ofSeconds(30)))
                        .build();
                try (TestApp app = new TestApp(filter, ds, 0)) {
                    // Warm up: the extension's features are read once.
                    assertEquals(201, counted(proxy, ds, app.port, "/tx", UUID.randomUUID().toString(), "{}", -1).answer().statusCode());

                    String key = UUID.randomUUID().toString();
                    Counted fresh = counted(proxy, ds, app.port, "/tx", key, "{\"n\": 1}", -1);
                    assertEquals(201, fresh.answer().statusCode(), () -> new String(fresh.answer().body()));
                    assertEquals(3, fresh.trips(), () -> "a fresh key: BEGIN with the claim, the INSERT, idem_complete with COMMIT: "
                            + fresh.statements());
                    assertTrue(fresh.claim().contains("deferred => true"), fresh.claim());

                    Counted replay = counted(proxy, ds, app.port, "/tx", key, "{\"n\": 1}", 1);
                    assertTrue(replayed(replay.answer()), () -> new String(replay.answer().body()));
                    assertEquals(2, replay.trips(), "a replay: BEGIN with the claim, the ROLLBACK after the answer");

                    Counted mismatch = counted(proxy, ds, app.port, "/tx", key, "{\"n\": 2}", 1);
                    assertEquals(422, mismatch.answer().statusCode());
                    assertEquals(2, mismatch.trips(), "a mismatch: BEGIN with the claim, the ROLLBACK after the answer");

                    String ext = UUID.randomUUID().toString();
                    Counted committed = counted(proxy, ds, app.port, "/ext", ext, "{}", -1);
                    assertEquals(201, committed.answer().statusCode());
                    assertFalse(committed.claim().contains("deferred"), "committed first is not deferred: " + committed.claim());
                    Counted again = counted(proxy, ds, app.port, "/ext", ext, "{}", 1);
                    assertTrue(replayed(again.answer()));
                    assertEquals(1, again.trips(), "a committed-first replay: the claim alone");

                    try (Connection observer = DriverManager.getConnection(DatabaseUrl.toJdbc(url))) {
                        theSameTransactionClaimWritesNothingBeforeTheComplete(observer, ds, app.port);
                        theCommittedFirstClaimIsThereAtOnce(observer, ds, app.port);
                    }
                } finally {
                    filter.destroy();
                }
            }
        }
    }
}
