package dev.pgidempotency.demo;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import dev.pgidempotency.DatabaseUrl;
import dev.pgidempotency.Json;
import java.io.File;
import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.time.Duration;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * The demo app as a process of its own, through PgBouncer in transaction pooling mode, over real
 * HTTP, SIGKILLed mid-handler. (tests/e2e/run.py runs the whole black-box suite against it.)
 */
class DemoAppTest {
    private static final int LEASE_MS = 1000;
    private final HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(5)).build();
    private String databaseUrl;
    private int port;
    private Process demo;
    private Path log;

    @BeforeEach
    void start() throws Exception {
        databaseUrl = System.getenv("PGBOUNCER_URL");
        assumeTrue(databaseUrl != null && !databaseUrl.isEmpty(), "PGBOUNCER_URL is not set: clients/java/test.sh starts PgBouncer");
        String base = System.getenv("JAVA_APPS_PORT");
        port = base == null ? 20999 : Integer.parseInt(base) + 5;
        log = Files.createTempFile("idempotency-demo", ".log");
        startDemo();
    }

    @AfterEach
    void stop() throws IOException {
        if (demo != null) {
            demo.destroyForcibly();
        }
        if (log != null) {
            Files.deleteIfExists(log);
        }
    }

    private void startDemo() throws Exception {
        String java = Path.of(System.getProperty("java.home"), "bin", "java").toString();
        demo = new ProcessBuilder(java, "-cp", System.getProperty("java.class.path"), ChargesDemo.class.getName(),
                "--listen", "127.0.0.1:" + port, "--database-url", databaseUrl, "--lease-ms", Integer.toString(LEASE_MS),
                "--allow-fault-injection")
                .redirectErrorStream(true).redirectOutput(ProcessBuilder.Redirect.appendTo(new File(log.toString()))).start();
        long deadline = System.nanoTime() + Duration.ofSeconds(30).toNanos();
        while (true) {
            try {
                if (http.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + "/healthz")).build(),
                        HttpResponse.BodyHandlers.ofString()).statusCode() == 200) {
                    return;
                }
            } catch (IOException e) {
                if (!demo.isAlive() || System.nanoTime() > deadline) {
                    throw new IllegalStateException("the demo did not start:\n" + Files.readString(log), e);
                }
                Thread.sleep(100);
            }
        }
    }

    private HttpResponse<String> post(String path, String tenant, String key, String body, String... headers) throws Exception {
        HttpRequest.Builder b = HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + path))
                .timeout(Duration.ofSeconds(60)).header("Content-Type", "application/json")
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
        return http.send(b.build(), HttpResponse.BodyHandlers.ofString());
    }

    private static boolean replayed(HttpResponse<?> r) {
        return r.headers().firstValue("Idempotent-Replayed").isPresent();
    }

    private long charges(String tenant) throws Exception {
        try (Connection c = DriverManager.getConnection(DatabaseUrl.toJdbc(databaseUrl));
                PreparedStatement st = c.prepareStatement("SELECT count(*) FROM charges WHERE tenant = ?")) {
            st.setString(1, tenant);
            try (ResultSet rs = st.executeQuery()) {
                rs.next();
                return rs.getLong(1);
            }
        }
    }

    private static final String AMOUNT = "{\"amount\": 500, \"currency\": \"eur\"}";

    @Test
    void bothRoutesReplayAndTheLocationFindsTheCharge() throws Exception {
        for (String route : new String[] {"/charges", "/charges/external"}) {
            String t = "acct-" + UUID.randomUUID();
            String k = UUID.randomUUID().toString();
            HttpResponse<String> first = post(route, t, k, AMOUNT);
            HttpResponse<String> again = post(route, t, k, "{\"currency\": \"eur\", \"amount\": 500.0}");
            assertEquals(201, first.statusCode(), first.body());
            assertTrue(replayed(again), route);
            assertEquals(first.body(), again.body(), route);
            String location = again.headers().firstValue("Location").orElseThrow();
            HttpResponse<String> got = http.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + location))
                    .header("X-Api-Key", t).build(), HttpResponse.BodyHandlers.ofString());
            assertEquals(200, got.statusCode());
            assertEquals(((Map<?, ?>) Json.parse(first.body())).get("id"), ((Map<?, ?>) Json.parse(got.body())).get("id"));
            assertEquals(1, charges(t), route);
        }
    }

    @Test
    void refusedRequestsLeaveTheKeyFree() throws Exception {
        String t = "acct-" + UUID.randomUUID();
        String k = UUID.randomUUID().toString();
        assertEquals(401, post("/charges", null, k, AMOUNT).statusCode());
        assertEquals(400, post("/charges", t, k, "{\"amount\": -5, \"currency\": \"eur\"}").statusCode());
        assertEquals(400, post("/charges", t, k, "{\"amount\": ").statusCode());
        HttpResponse<String> failed = post("/charges/external", t, k, AMOUNT, "X-Fault-Fail-Before", "1");
        assertEquals(500, failed.statusCode());
        HttpResponse<String> ok = post("/charges/external", t, k, AMOUNT);
        assertEquals(201, ok.statusCode(), ok.body());
        assertFalse(replayed(ok));
        assertEquals(1, charges(t));
    }

    @Test
    void killedMidHandlerTheRetryCompletesOnce() throws Exception {
        String t = "acct-" + UUID.randomUUID();
        String k = UUID.randomUUID().toString();
        CompletableFuture<HttpResponse<String>> doomed = CompletableFuture.supplyAsync(() -> {
            try {
                return post("/charges/external", t, k, AMOUNT, "X-Fault-Delay-Ms", Integer.toString(LEASE_MS * 10));
            } catch (Exception e) {
                return null;
            }
        });
        Thread.sleep(LEASE_MS * 2L); // renewed past its first lease
        assertEquals(409, post("/charges/external", t, k, AMOUNT).statusCode(), "the renewed claim is still held");
        demo.destroyForcibly().waitFor();
        assertEquals(null, doomed.get(), "the killed request got no answer");
        startDemo();
        HttpResponse<String> r;
        int conflicts = 0;
        while ((r = post("/charges/external", t, k, AMOUNT)).statusCode() == 409 && conflicts < 100) {
            conflicts++;
            Thread.sleep(100);
        }
        assertEquals(201, r.statusCode(), r.body());
        assertFalse(replayed(r));
        assertEquals(1, charges(t));
        assertTrue(replayed(post("/charges/external", t, k, AMOUNT)));
    }
}
