package dev.pgidempotency.servlet;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.zaxxer.hikari.HikariConfig;
import com.zaxxer.hikari.HikariDataSource;
import dev.pgidempotency.Json;
import dev.pgidempotency.http.Problem;
import java.net.ServerSocket;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** A database that refuses connections: 503 problem+json with Retry-After, never an error page. */
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
                    assertEquals(503, r.statusCode(), path);
                    assertEquals(Problem.CONTENT_TYPE, r.headers().firstValue("Content-Type").orElse(null), path);
                    assertTrue(r.headers().firstValue("Retry-After").isPresent(), path);
                    assertEquals(Problem.SERVICE_UNAVAILABLE.type(), ((Map<?, ?>) Json.parse(r.body())).get("type"), path);
                }
            } finally {
                filter.destroy();
            }
        }
    }
}
