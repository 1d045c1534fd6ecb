package dev.pgidempotency.servlet;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import com.zaxxer.hikari.HikariConfig;
import com.zaxxer.hikari.HikariDataSource;
import dev.pgidempotency.DatabaseUrl;
import dev.pgidempotency.Json;
import dev.pgidempotency.http.Problem;
import java.net.ServerSocket;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.sql.Connection;
import java.sql.ResultSet;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import org.postgresql.ds.PGSimpleDataSource;
import org.junit.jupiter.api.Test;

/** A database that refuses connections or resets them: 503 problem+json with Retry-After, never an error page. */
class UnreachableDatabaseTest {
    @Test
    void refusedConnectionsAnswer503() throws Exception {
        int deadPort;
        try (ServerSocket s = new ServerSocket(0)) {
            deadPort = s.getLocalPort(); // free once closed: nothing listens there
        }
        HikariConfig c = new HikariConfig();
        c.setJdbcUrl("jdbc:postgresql://127.0.0.1:" + deadPort + "/postgres?user=postgres&connectTimeout=2");
        c.setConnectionTimeout(1000);
        c.setInitializationFailTimeout(-1);
        String base = System.getenv("JAVA_APPS_PORT");
        try (HikariDataSource ds = new HikariDataSource(c)) {
            IdempotencyFilter filter = IdempotencyFilter.builder(ds)
                    .route("POST", "/tx", RouteOptions.DEFAULTS)
                    .route("POST", "/ext", RouteOptions.DEFAULTS.withMode(Mode.COMMITTED_FIRST))
                    .build();
            try (TestApp app = new TestApp(filter, ds, base == null ? 0 : Integer.parseInt(base) + 2)) {
                HttpClient http = HttpClient.newHttpClient();
                for (String path : new String[] {"/tx", "/ext"}) {
                    HttpResponse<byte[]> r = http.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + app.port + path))
                            .header("Idempotency-Key", "\"k1\"").header("Content-Type", "application/json")
                            .timeout(Duration.ofSeconds(30))
                            .POST(HttpRequest.BodyPublishers.ofString("{}")).build(), HttpResponse.BodyHandlers.ofByteArray());
                    assertServiceUnavailable(r, path);
                }
            } finally {
                filter.destroy();
            }
        }
    }

    private static void assertServiceUnavailable(HttpResponse<byte[]> r, String what) {
        assertEquals(503, r.statusCode(), what);
        assertEquals(Problem.CONTENT_TYPE, r.headers().firstValue("Content-Type").orElse(null), what);
        assertTrue(r.headers().firstValue("Retry-After").isPresent(), what);
        assertEquals(Problem.SERVICE_UNAVAILABLE.type(), ((Map<?, ?>) Json.parse(r.body())).get("type"), what);
    }

    private static HttpResponse<byte[]> post(int port, String path, String... headers) throws Exception {
        HttpRequest.Builder b = HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + path))
                .header("Idempotency-Key", "\"k-" + System.nanoTime() + "\"").header("Content-Type", "application/json")
                .timeout(Duration.ofSeconds(30)).POST(HttpRequest.BodyPublishers.ofString("{}"));
        for (int i = 0; i < headers.length; i += 2) {
            b.header(headers[i], headers[i + 1]);
        }
        return HttpClient.newHttpClient().send(b.build(), HttpResponse.BodyHandlers.ofByteArray());
    }

    private static void assertWithinTheBound(long startedNanos, String what) {
        double took = (System.nanoTime() - startedNanos) / 1e9;
        assertTrue(took < 2.0, what + ": answered in " + took + " s, not within 2 s");
    }

    /**
     * The filter's own bound, whatever the pool's: HikariCP with its default connectionTimeout
     * (30 s) against a port where nothing listens, and a plain DataSource whose server accepts
     * the connection and never answers (pgjdbc would wait for it as long as the socket lives):
     * 503 problem+json within 2 s, both modes.
     */
    @Test
    void the503ComesWithinTheFiltersBoundWhateverThePoolWaits() throws Exception {
        int deadPort;
        try (ServerSocket s = new ServerSocket(0)) {
            deadPort = s.getLocalPort();
        }
        HikariConfig c = new HikariConfig();
        c.setJdbcUrl("jdbc:postgresql://127.0.0.1:" + deadPort + "/postgres?user=postgres");
        c.setInitializationFailTimeout(-1);
        assertEquals(30_000, c.getConnectionTimeout(), "HikariCP's default");
        String base = System.getenv("JAVA_APPS_PORT");
        List<java.net.Socket> held = java.util.Collections.synchronizedList(new java.util.ArrayList<>());
        try (HikariDataSource hikari = new HikariDataSource(c); ServerSocket silent = new ServerSocket(0)) {
            Thread accepting = new Thread(() -> {
                try {
                    while (true) {
                        held.add(silent.accept()); // and never a byte back
                    }
                } catch (java.io.IOException e) {
                    // closed: the test is over
                }
            });
            accepting.setDaemon(true);
            accepting.start();
            PGSimpleDataSource mute = new PGSimpleDataSource();
            mute.setUrl("jdbc:postgresql://127.0.0.1:" + silent.getLocalPort() + "/postgres?user=postgres&connectTimeout=0");
            for (javax.sql.DataSource ds : List.<javax.sql.DataSource>of(hikari, mute)) {
                IdempotencyFilter filter = IdempotencyFilter.builder(ds)
                        .route("POST", "/tx", RouteOptions.DEFAULTS)
                        .route("POST", "/ext", RouteOptions.DEFAULTS.withMode(Mode.COMMITTED_FIRST))
                        .build();
                try (TestApp app = new TestApp(filter, ds, base == null ? 0 : Integer.parseInt(base) + 2)) {
                    for (String path : new String[] {"/tx", "/ext"}) {
                        long started = System.nanoTime();
                        HttpResponse<byte[]> r = post(app.port, path);
                        assertServiceUnavailable(r, ds.getClass().getSimpleName() + " " + path);
                        assertWithinTheBound(started, ds.getClass().getSimpleName() + " " + path);
                    }
                } finally {
                    filter.destroy();
                }
            }
        } finally {
            for (java.net.Socket socket : List.copyOf(held)) {
                socket.close(); // the waiting connection attempts end
            }
        }
    }

    @Test
    void refusedWithoutAPoolAnswers503() throws Exception {
        int deadPort;
        try (ServerSocket s = new ServerSocket(0)) {
            deadPort = s.getLocalPort();
        }
        PGSimpleDataSource ds = new PGSimpleDataSource();
        ds.setUrl("jdbc:postgresql://127.0.0.1:" + deadPort + "/postgres?user=postgres");
        IdempotencyFilter filter = IdempotencyFilter.builder(ds).route("POST", "/tx", RouteOptions.DEFAULTS).build();
        String base = System.getenv("JAVA_APPS_PORT");
        try (TestApp app = new TestApp(filter, ds, base == null ? 0 : Integer.parseInt(base) + 2)) {
            assertServiceUnavailable(post(app.port, "/tx"), "connection refused (08001)");
        } finally {
            filter.destroy();
        }
    }

    @Test
    void aConnectionResetMidRequestAnswers503() throws Exception {
        String url = System.getenv("DATABASE_URL");
        assumeTrue(url != null && !url.isEmpty(), "DATABASE_URL is not set: clients/java/test.sh starts the server");
        PGSimpleDataSource ds = new PGSimpleDataSource();
        ds.setUrl(DatabaseUrl.toJdbc(url) + "&ApplicationName=idem-reset-test");
        TestApp.createTable(ds);
        IdempotencyFilter filter = IdempotencyFilter.builder(ds).route("POST", "/tx", RouteOptions.DEFAULTS).build();
        String base = System.getenv("JAVA_APPS_PORT");
        try (TestApp app = new TestApp(filter, ds, base == null ? 0 : Integer.parseInt(base) + 2)) {
            CompletableFuture<HttpResponse<byte[]>> slow = CompletableFuture.supplyAsync(() -> {
                try {
                    return post(app.port, "/tx", "X-Test-Sleep-Ms", "1500");
                } catch (Exception e) {
                    throw new IllegalStateException(e);
                }
            });
            int killed = 0;
            try (Connection c = ds.getConnection()) {
                for (int i = 0; i < 100 && killed == 0; i++) {
                    Thread.sleep(20);
                    try (ResultSet rs = c.createStatement().executeQuery(
                            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
                            + " AND application_name = 'idem-reset-test' AND state = 'idle in transaction'")) {
                        rs.next();
                        killed = rs.getInt(1);
                    }
                }
            }
            assertEquals(1, killed, "the claim's backend was terminated while the handler ran");
            assertServiceUnavailable(slow.get(), "connection reset during the handler (57P01)");
        } finally {
            filter.destroy();
        }
    }
}
