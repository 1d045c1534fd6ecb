package dev.pgidempotency.spring;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import dev.pgidempotency.DatabaseUrl;
import dev.pgidempotency.Json;
import dev.pgidempotency.http.Problem;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;
import java.util.Map;
import java.util.UUID;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;
import org.springframework.boot.builder.SpringApplicationBuilder;
import org.springframework.context.ConfigurableApplicationContext;
import org.springframework.jdbc.core.JdbcTemplate;

/**
 * The starter in a real Boot application over real HTTP. Run by {@link StarterDirectTest} (the
 * server) and {@link StarterThroughPgBouncerTest} (PgBouncer, transaction pooling).
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
abstract class StarterTests {
    private final HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(5)).build();
    private ConfigurableApplicationContext app;
    private JdbcTemplate jdbc;
    private int port;

    abstract String database();

    abstract int portOffset();

    /** Without the database each test is reported as skipped, with the reason. */
    @BeforeEach
    void needsTheDatabase() {
        assumeTrue(app != null, database() + " is not set: clients/java/test.sh starts the server and PgBouncer");
    }

    @BeforeAll
    void start() {
        String url = System.getenv(database());
        if (url == null || url.isEmpty()) {
            return;
        }
        String base = System.getenv("JAVA_APPS_PORT");
        app = new SpringApplicationBuilder(TestApplication.class).properties(
                "server.address=127.0.0.1",
                "server.port=" + (base == null ? 0 : Integer.parseInt(base) + portOffset()),
                "spring.datasource.url=" + DatabaseUrl.toJdbc(url),
                "spring.main.banner-mode=off",
                "logging.level.root=warn",
                "idempotency.tenant-header=X-Api-Key",
                "idempotency.lease=2s").run();
        port = Integer.parseInt(app.getEnvironment().getProperty("local.server.port"));
        jdbc = app.getBean(JdbcTemplate.class);
    }

    @AfterAll
    void stop() {
        if (app != null) {
            app.close();
        }
    }

    private HttpResponse<byte[]> post(String path, String tenant, String key, String body, String... headers) throws Exception {
        HttpRequest.Builder b = HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + path))
                .timeout(Duration.ofSeconds(30)).header("Content-Type", "application/json")
                .POST(HttpRequest.BodyPublishers.ofString(body));
        if (tenant != null) {
            b.header("X-Api-Key", tenant);
        }
        if (key != null) {
            b.header("Idempotency-Key", "\"" + key + "\"");
        }
        for (int i = 0; i < headers.length; i += 2) {
            b.header(headers[i], headers[i + 1]);
        }
        return http.send(b.build(), HttpResponse.BodyHandlers.ofByteArray());
    }

    private static boolean replayed(HttpResponse<?> r) {
        return r.headers().firstValue("Idempotent-Replayed").isPresent();
    }

    private long rows(String tenant) {
        return jdbc.queryForObject("SELECT count(*) FROM boot_items WHERE tenant = ?", Long.class, tenant);
    }

    private long records(String tenant) {
        return jdbc.queryForObject("SELECT count(*) FROM idempotency.keys WHERE scope LIKE ?", Long.class, tenant + ":%");
    }

    private static String type(HttpResponse<byte[]> r) {
        return (String) ((Map<?, ?>) Json.parse(r.body())).get("type");
    }

    private static final String BODY = "{\"amount\": 5, \"currency\": \"eur\"}";

    @Test
    void anIdempotentMethodRunsOnceAndReplays() throws Exception {
        String t = "t-" + UUID.randomUUID();
        String k = UUID.randomUUID().toString();
        HttpResponse<byte[]> first = post("/items", t, k, BODY);
        HttpResponse<byte[]> again = post("/items", t, k, BODY);
        assertEquals(201, first.statusCode(), new String(first.body()));
        assertEquals("claimed", ((Map<?, ?>) Json.parse(first.body())).get("claimed"), "the IdempotencyContext parameter");
        assertFalse(replayed(first));
        assertEquals(201, again.statusCode());
        assertTrue(replayed(again));
        assertArrayEquals(first.body(), again.body());
        assertEquals(first.headers().firstValue("Location"), again.headers().firstValue("Location"));
        assertEquals(1, rows(t));
        assertEquals(t + ":POST /items", jdbc.queryForObject("SELECT scope FROM idempotency.keys WHERE key = ?", String.class, k));
        HttpResponse<byte[]> other = post("/items", t, k, "{\"amount\": 6, \"currency\": \"eur\"}");
        assertEquals(422, other.statusCode());
        assertEquals(Problem.REUSED.type(), type(other));
    }

    @Test
    void jdbcTemplateWritesShareTheClaimsTransaction() throws Exception {
        String t = "t-" + UUID.randomUUID();
        String k = UUID.randomUUID().toString();
        assertEquals(503, post("/items", t, k, BODY, "X-Test-Status", "503").statusCode());
        assertEquals(0, rows(t), "the JdbcTemplate insert was rolled back with the claim");
        assertEquals(0, records(t));
        HttpResponse<byte[]> ok = post("/items", t, k, BODY);
        assertEquals(201, ok.statusCode());
        assertFalse(replayed(ok));
        assertEquals(1, rows(t));
    }

    @Test
    void aRequestSpringRefusesLeavesTheKeyFree() throws Exception {
        String t = "t-" + UUID.randomUUID();
        String k = UUID.randomUUID().toString();
        HttpResponse<byte[]> refused = post("/items", t, k, "{\"amount\": \"many\", \"currency\": \"eur\"}");
        assertEquals(400, refused.statusCode(), new String(refused.body()));
        assertEquals(Problem.CONTENT_TYPE, refused.headers().firstValue("Content-Type").orElse(null));
        assertEquals(0, records(t));
        assertEquals(201, post("/items", t, k, BODY).statusCode());
    }

    @Test
    void keysTenantsAndUnprotectedMethods() throws Exception {
        String t = "t-" + UUID.randomUUID();
        HttpResponse<byte[]> missing = post("/items", t, null, BODY);
        assertEquals(400, missing.statusCode());
        assertEquals(Problem.KEY_MISSING.type(), type(missing));
        assertEquals(401, post("/items", null, UUID.randomUUID().toString(), BODY).statusCode());
        assertEquals(200, post("/plain", t, null, BODY).statusCode());
        assertEquals(200, post("/plain", t, null, BODY).statusCode());
        assertEquals(2, rows(t));
        assertEquals(0, records(t), "methods without @Idempotent claim nothing");
    }

    @Test
    void committedFirstOnAPathTemplate() throws Exception {
        String t = "t-" + UUID.randomUUID();
        String k = UUID.randomUUID().toString();
        HttpResponse<byte[]> first = post("/orders/42/pay", t, k, BODY);
        HttpResponse<byte[]> again = post("/orders/42/pay", t, k, BODY);
        assertEquals(201, first.statusCode(), new String(first.body()));
        assertTrue(replayed(again));
        assertArrayEquals(first.body(), again.body());
        assertEquals(1, rows(t));
        assertEquals(t + ":POST /orders/{id}/pay",
                jdbc.queryForObject("SELECT scope FROM idempotency.keys WHERE key = ?", String.class, k));
    }
}
