package dev.pgidempotency.servlet;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import com.zaxxer.hikari.HikariConfig;
import com.zaxxer.hikari.HikariDataSource;
import dev.pgidempotency.DatabaseUrl;
import dev.pgidempotency.Json;
import dev.pgidempotency.http.HttpProblemException;
import dev.pgidempotency.http.Problem;
import dev.pgidempotency.http.StoredResponse;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;

/**
 * The filter over real HTTP (embedded Tomcat, java.net.http) against the real extension. Run by
 * {@link DirectTest} (the server) and {@link ThroughPgBouncerTest} (PgBouncer, transaction pooling).
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
abstract class FilterHttpTests {
    static final Duration LEASE = Duration.ofMillis(900);
    private final HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(5)).build();
    private HikariDataSource ds;
    private IdempotencyFilter filter;
    private TestApp app;

    /** The environment variable naming the database URL. */
    abstract String database();

    /** Offset from JAVA_APPS_PORT (clients/java/test.sh sets it; else a free port). */
    abstract int portOffset();

    /** Without the database each test is reported as skipped, with the reason. */
    @BeforeEach
    void needsTheDatabase() {
        assumeTrue(app != null, database() + " is not set: clients/java/test.sh starts the server and PgBouncer");
    }

    @BeforeAll
    void start() throws Exception {
        String url = System.getenv(database());
        if (url == null || url.isEmpty()) {
            return;
        }
        HikariConfig c = new HikariConfig();
        c.setJdbcUrl(DatabaseUrl.toJdbc(url));
        c.setMaximumPoolSize(20);
        ds = new HikariDataSource(c);
        TestApp.createTable(ds);
        RouteOptions base = RouteOptions.DEFAULTS.withLease(LEASE);
        filter = IdempotencyFilter.builder(ds)
                .tenant(r -> {
                    String t = r.getHeader("X-Api-Key");
                    if ("".equals(t)) {
                        throw new HttpProblemException(401, "Unauthorized", "Give your API key.");
                    }
                    return t;
                })
                .route("POST", "/tx", base)
                .route("POST", "/tx/{id}/items", base)
                .route("POST", "/ext", base.withMode(Mode.COMMITTED_FIRST))
                .route("POST", "/optional", base.withRequired(false))
                .route("POST", "/store5xx", base.withStoreServerErrors(true))
                .route("POST", "/ignore", base.withIgnore(Set.of("ts")))
                .build();
        String base0 = System.getenv("JAVA_APPS_PORT");
        app = new TestApp(filter, ds, base0 == null ? 0 : Integer.parseInt(base0) + portOffset());
    }

    @AfterAll
    void stop() throws Exception {
        if (app != null) {
            app.close();
        }
        if (filter != null) {
            filter.destroy();
        }
        if (ds != null) {
            ds.close();
        }
    }

    private static String tenant() {
        return "t-" + UUID.randomUUID();
    }

    private static String quoted(String key) {
        return "\"" + key + "\"";
    }

    private HttpResponse<byte[]> post(String path, String tenant, String key, String body, String... headers) throws Exception {
        HttpRequest.Builder b = HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + app.port + path))
                .timeout(Duration.ofSeconds(30))
                .header("Content-Type", "application/json")
                .POST(HttpRequest.BodyPublishers.ofString(body));
        if (tenant != null) {
            b.header("X-Api-Key", tenant);
        }
        if (key != null) {
            b.header("Idempotency-Key", key);
        }
        for (int i = 0; i < headers.length; i += 2) {
            b.header(headers[i], headers[i + 1]);
        }
        return http.send(b.build(), HttpResponse.BodyHandlers.ofByteArray());
    }

    private static boolean replayed(HttpResponse<?> r) {
        return "true".equals(r.headers().firstValue("Idempotent-Replayed").orElse(null));
    }

    private static void assertProblem(HttpResponse<byte[]> r, int status, Problem p) {
        assertEquals(status, r.statusCode(), () -> new String(r.body()));
        assertEquals(Problem.CONTENT_TYPE, r.headers().firstValue("Content-Type").orElse(null));
        Map<?, ?> body = (Map<?, ?>) Json.parse(r.body());
        assertEquals(status, ((Number) body.get("status")).intValue());
        assertTrue(body.get("title") instanceof String && body.get("detail") instanceof String, body.toString());
        if (p != null) {
            assertEquals(p.type(), body.get("type"));
            assertEquals(p.retryAfter(), r.headers().firstValue("Retry-After").isPresent());
        }
    }

    private long records(String tenant) throws Exception {
        try (Connection c = ds.getConnection();
                PreparedStatement st = c.prepareStatement("SELECT count(*) FROM idempotency.keys WHERE scope LIKE ?")) {
            st.setString(1, tenant + ":%");
            try (ResultSet rs = st.executeQuery()) {
                rs.next();
                return rs.getLong(1);
            }
        }
    }

    private static final String BODY = "{\"amount\": 500, \"currency\": \"eur\"}";

    @Test
    void aRetryReplaysTheFirstResponseByteForByte() throws Exception {
        String t = tenant();
        String k = quoted(UUID.randomUUID().toString());
        HttpResponse<byte[]> first = post("/tx", t, k, BODY);
        HttpResponse<byte[]> again = post("/tx", t, k, "{\"currency\":\"eur\",\"amount\":500.0}");
        assertEquals(201, first.statusCode());
        assertFalse(replayed(first));
        assertEquals("1", first.headers().firstValue("X-Not-Stored").orElse(null), "the first answer has every header");
        assertEquals(201, again.statusCode());
        assertTrue(replayed(again));
        assertArrayEquals(first.body(), again.body());
        assertEquals(first.headers().firstValue("Location"), again.headers().firstValue("Location"));
        assertNull(again.headers().firstValue("X-Not-Stored").orElse(null), "only allow-listed headers are stored");
        assertEquals(1, TestApp.count(ds, t));
        assertEquals(1, records(t));
    }

    @Test
    void theScopeNamesTheRouteTemplate() throws Exception {
        String t = tenant();
        String k = UUID.randomUUID().toString();
        assertEquals(201, post("/tx/1/items", t, quoted(k), BODY).statusCode());
        HttpResponse<byte[]> other = post("/tx/2/items", t, quoted(k), BODY);
        assertTrue(replayed(other), "the same template is one scope");
        try (Connection c = ds.getConnection();
                PreparedStatement st = c.prepareStatement("SELECT scope FROM idempotency.keys WHERE key = ?")) {
            st.setString(1, k);
            try (ResultSet rs = st.executeQuery()) {
                assertTrue(rs.next());
                assertEquals(t + ":POST /tx/{id}/items", rs.getString(1));
            }
        }
    }

    @Test
    void missingOrMalformedKeysAre400ProblemsBeforeAnyClaim() throws Exception {
        String t = tenant();
        assertProblem(post("/tx", t, null, BODY), 400, Problem.KEY_MISSING);
        assertProblem(post("/tx", t, "a b", BODY), 400, Problem.KEY_INVALID);
        assertProblem(post("/tx", t, quoted("k".repeat(256)), BODY), 400, Problem.KEY_INVALID);
        assertProblem(post("/tx", t, "\"a\";p=1", BODY), 400, Problem.KEY_INVALID);
        assertProblem(post("/tx", t, quoted("a"), BODY, "Idempotency-Key", quoted("b")), 400, Problem.KEY_INVALID);
        assertProblem(post("/tx", "", quoted("a"), BODY), 401, null);
        assertProblem(post("/tx", "", null, BODY), 401, null);
        assertEquals(0, TestApp.count(ds, t));
        assertEquals(0, records(t));
        assertEquals(201, post("/tx", t, UUID.randomUUID().toString(), BODY).statusCode(), "a bare UUID is a key");
    }

    @Test
    void aKeyReusedWithAnotherPayloadIs422() throws Exception {
        for (String path : List.of("/tx", "/ext")) {
            String t = tenant();
            String k = quoted(UUID.randomUUID().toString());
            assertEquals(201, post(path, t, k, BODY).statusCode());
            assertProblem(post(path, t, k, "{\"amount\": 501, \"currency\": \"eur\"}"), 422, Problem.REUSED);
            assertEquals(1, TestApp.count(ds, t));
        }
    }

    @Test
    void concurrentDuplicatesRunOnce() throws Exception {
        for (String path : List.of("/tx", "/ext")) {
            String t = tenant();
            String k = quoted(UUID.randomUUID().toString());
            int n = 12;
            ExecutorService pool = Executors.newFixedThreadPool(n);
            CountDownLatch go = new CountDownLatch(1);
            List<Future<HttpResponse<byte[]>>> answers = new ArrayList<>();
            for (int i = 0; i < n; i++) {
                answers.add(pool.submit(() -> {
                    go.await();
                    return post(path, t, k, BODY, "X-Test-Sleep-Ms", "200");
                }));
            }
            go.countDown();
            int firsts = 0;
            byte[] firstBody = null;
            List<byte[]> replays = new ArrayList<>();
            for (Future<HttpResponse<byte[]>> f : answers) {
                HttpResponse<byte[]> r = f.get();
                if (r.statusCode() == 201 && !replayed(r)) {
                    firsts++;
                    firstBody = r.body();
                } else if (r.statusCode() == 201) {
                    replays.add(r.body());
                } else {
                    assertProblem(r, 409, Problem.IN_PROGRESS);
                }
            }
            pool.shutdown();
            assertEquals(1, firsts, path);
            for (byte[] b : replays) {
                assertArrayEquals(firstBody, b, path);
            }
            assertEquals(1, TestApp.count(ds, t), path);
        }
    }

    @Test
    void aThrownProblemOrFailureLeavesTheKeyFree() throws Exception {
        for (String path : List.of("/tx", "/ext")) {
            String t = tenant();
            String k = quoted(UUID.randomUUID().toString());
            HttpResponse<byte[]> refused = post(path, t, k, BODY, "X-Test-Throw", "problem");
            assertProblem(refused, 400, null);
            assertEquals("about:blank", ((Map<?, ?>) Json.parse(refused.body())).get("type"));
            assertProblem(post(path, t, k, BODY, "X-Test-Throw", "error"), 500, Problem.INTERNAL_ERROR);
            assertEquals(0, records(t), path + ": released");
            HttpResponse<byte[]> ok = post(path, t, k, BODY);
            assertEquals(201, ok.statusCode(), path);
            assertFalse(replayed(ok), path);
        }
        String t = tenant();
        assertEquals(201, post("/tx", t, quoted("x"), BODY).statusCode());
        assertEquals(1, TestApp.count(ds, t), "same transaction: the failed attempts' writes were rolled back");
    }

    /** One raw request line by line (java.net.http refuses control characters in header values); its status line and Content-Type. */
    private String[] raw(String tenant, byte[] keyValue) throws Exception {
        byte[] body = BODY.getBytes(StandardCharsets.UTF_8);
        java.io.ByteArrayOutputStream req = new java.io.ByteArrayOutputStream();
        req.write(("POST /tx HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n"
                + "X-Api-Key: " + tenant + "\r\nContent-Length: " + body.length + "\r\nIdempotency-Key: ")
                .getBytes(StandardCharsets.ISO_8859_1));
        req.write(keyValue);
        req.write("\r\n\r\n".getBytes(StandardCharsets.ISO_8859_1));
        req.write(body);
        try (java.net.Socket sock = new java.net.Socket("127.0.0.1", app.port)) {
            sock.setSoTimeout(10_000);
            sock.getOutputStream().write(req.toByteArray());
            String head = new String(sock.getInputStream().readAllBytes(), StandardCharsets.ISO_8859_1).split("\r\n\r\n")[0];
            String type = head.lines().filter(l -> l.toLowerCase(java.util.Locale.ROOT).startsWith("content-type:"))
                    .map(l -> l.substring(13).strip()).findFirst().orElse("");
            return new String[] {head.lines().findFirst().orElse(""), type};
        }
    }

    /**
     * What really happens to control characters in the key on Tomcat (what the README says):
     * every one but the tab is refused by Tomcat itself, before the filter, with its own HTML 400
     * page; the tab (and any non-ASCII byte) reaches the filter: 400 problem+json
     * idempotency-key-invalid. Nothing is claimed either way.
     */
    @Test
    void controlCharactersInTheKey() throws Exception {
        String t = tenant();
        for (int c = 0; c < 0x80; c++) {
            if (c >= 0x20 && c < 0x7f) {
                continue;
            }
            byte[] key = {'"', 'k', (byte) c, '1', '"'};
            String[] got = raw(t, key);
            String want = c == '\t' ? "HTTP/1.1 400 ;" + Problem.CONTENT_TYPE : "HTTP/1.1 400 ;text/html;charset=utf-8";
            assertEquals(want, got[0] + ";" + got[1], "control character 0x" + Integer.toHexString(c));
        }
        String[] nonAscii = raw(t, new byte[] {'"', 'k', (byte) 0xc3, (byte) 0xa9, '"'});
        assertEquals("HTTP/1.1 400 ;" + Problem.CONTENT_TYPE, nonAscii[0] + ";" + nonAscii[1], "a non-ASCII key");
        assertEquals(0, records(t), "nothing claimed");
        assertEquals(0, TestApp.count(ds, t), "nothing ran");
    }

    /** contract.json's refused_statuses, 422 included: the handler's own refusal is not stored, the key stays free. */
    @Test
    void theHandlersOwnRefusalsLeaveTheKeyFree() throws Exception {
        for (String path : List.of("/tx", "/ext")) {
            for (int status : List.of(404, 409, 422)) {
                String t = tenant();
                String k = quoted(UUID.randomUUID().toString());
                assertEquals(status, post(path, t, k, BODY, "X-Test-Status", String.valueOf(status)).statusCode());
                boolean refused = StoredResponse.REFUSED_STATUSES.contains(status);
                assertEquals(refused ? 0 : 1, records(t), path + " " + status);
                HttpResponse<byte[]> again = post(path, t, k, BODY);
                if (refused) {
                    assertEquals(201, again.statusCode(), path + " " + status);
                    assertFalse(replayed(again), path + " " + status);
                } else {
                    assertEquals(status, again.statusCode(), path + " " + status + ": stored and replayed");
                    assertTrue(replayed(again), path + " " + status);
                }
            }
        }
    }

    @Test
    void serverErrorsGiveTheKeyBackUnlessStored() throws Exception {
        String t = tenant();
        String k = quoted(UUID.randomUUID().toString());
        assertEquals(503, post("/tx", t, k, BODY, "X-Test-Status", "503").statusCode());
        assertEquals(0, records(t));
        assertEquals(0, TestApp.count(ds, t), "rolled back");
        assertFalse(replayed(post("/tx", t, k, BODY)));
        HttpResponse<byte[]> stored = post("/store5xx", t, k, BODY, "X-Test-Status", "500");
        HttpResponse<byte[]> again = post("/store5xx", t, k, BODY);
        assertEquals(500, again.statusCode());
        assertTrue(replayed(again));
        assertArrayEquals(stored.body(), again.body());
        assertProblem(post("/tx", tenant(), k, BODY, "X-Test-Send-Error", "403"), 403, null);
    }

    @Test
    void aBodyThatIsNotJsonIsRefusedBeforeTheClaim() throws Exception {
        String t = tenant();
        String k = quoted(UUID.randomUUID().toString());
        assertProblem(post("/tx", t, k, "{\"amount\": "), 400, null);
        assertEquals(0, records(t));
        assertEquals(201, post("/tx", t, k, BODY).statusCode());
    }

    @Test
    void textAndBinaryBodiesReplayByteForByte() throws Exception {
        for (String kind : List.of("text", "binary")) {
            String t = tenant();
            String k = quoted(UUID.randomUUID().toString());
            HttpResponse<byte[]> first = post("/tx", t, k, BODY, "X-Test-Body", kind);
            HttpResponse<byte[]> again = post("/tx", t, k, BODY);
            assertEquals(201, again.statusCode(), kind);
            assertTrue(replayed(again), kind);
            assertArrayEquals(first.body(), again.body(), kind);
            assertEquals(first.headers().firstValue("Content-Type"), again.headers().firstValue("Content-Type"), kind);
        }
    }

    @Test
    void optionalKeysAndIgnoredFields() throws Exception {
        String t = tenant();
        assertEquals(201, post("/optional", t, null, BODY).statusCode());
        assertEquals(201, post("/optional", t, null, BODY).statusCode());
        assertEquals(2, TestApp.count(ds, t), "without a key the route runs unprotected");
        String k = quoted(UUID.randomUUID().toString());
        assertEquals(201, post("/ignore", t, k, "{\"a\": 1, \"ts\": 1}").statusCode());
        assertTrue(replayed(post("/ignore", t, k, "{\"a\": 1, \"ts\": 2}")), "ts is left out of the fingerprint");
        assertProblem(post("/ignore", t, k, "{\"a\": 2, \"ts\": 1}"), 422, Problem.REUSED);
    }

    @Test
    void committedFirstAnswers409WithRetryAfterWhileTheLeaseIsRenewed() throws Exception {
        String t = tenant();
        String k = quoted(UUID.randomUUID().toString());
        ExecutorService pool = Executors.newSingleThreadExecutor();
        Future<HttpResponse<byte[]>> slow = pool.submit(() -> post("/ext", t, k, BODY, "X-Test-Sleep-Ms", "2500"));
        Thread.sleep(300);
        HttpResponse<byte[]> dup = post("/ext", t, k, BODY);
        assertProblem(dup, 409, Problem.IN_PROGRESS);
        int retryAfter = Integer.parseInt(dup.headers().firstValue("Retry-After").orElseThrow());
        assertTrue(retryAfter >= 1 && retryAfter <= 1, "Retry-After from the lease (0.9 s): " + retryAfter);
        Thread.sleep(1500); // past the first lease: still held, because it was renewed
        assertProblem(post("/ext", t, k, BODY), 409, Problem.IN_PROGRESS);
        HttpResponse<byte[]> first = slow.get();
        pool.shutdown();
        assertEquals(201, first.statusCode());
        HttpResponse<byte[]> again = post("/ext", t, k, BODY);
        assertTrue(replayed(again));
        assertArrayEquals(first.body(), again.body());
        assertEquals(1, TestApp.count(ds, t));
    }

    @Test
    void committedFirstStoresAFailureAfterASideEffect() throws Exception {
        String t = tenant();
        String k = quoted(UUID.randomUUID().toString());
        HttpResponse<byte[]> failed = post("/ext", t, k, BODY, "X-Test-Checkpoint", "1", "X-Test-Throw", "error");
        assertProblem(failed, 500, Problem.INTERNAL_ERROR);
        HttpResponse<byte[]> again = post("/ext", t, k, BODY);
        assertEquals(500, again.statusCode());
        assertTrue(replayed(again), "the failure after the checkpoint was stored");
        assertArrayEquals(failed.body(), again.body(), "the stored failure replays byte for byte");
        assertEquals(1, TestApp.count(ds, t));
    }

    @Test
    void aLateCompletionAfterATakeoverIsFenced() throws Exception {
        String t = tenant();
        String key = UUID.randomUUID().toString();
        ExecutorService pool = Executors.newSingleThreadExecutor();
        Future<HttpResponse<byte[]>> doomed = pool.submit(() -> post("/ext", t, quoted(key), BODY, "X-Test-Wait-Lost", "1"));
        String scope = t + ":POST /ext";
        // Take the claim away from the running request: release it with its own token, claim it anew.
        UUID token = null;
        for (int i = 0; i < 100 && token == null; i++) {
            Thread.sleep(50);
            try (Connection c = ds.getConnection();
                    PreparedStatement st = c.prepareStatement("SELECT token FROM idempotency.idem_lookup(?, ?)")) {
                st.setString(1, scope);
                st.setString(2, key);
                try (ResultSet rs = st.executeQuery()) {
                    token = rs.next() ? rs.getObject(1, UUID.class) : null;
                }
            }
        }
        try (Connection c = ds.getConnection();
                PreparedStatement st = c.prepareStatement(
                        "SELECT idempotency.idem_release(?, ?, ?), (idempotency.idem_claim(?, ?, NULL, lease => '1 minute')).outcome")) {
            st.setString(1, scope);
            st.setString(2, key);
            st.setObject(3, token);
            st.setString(4, scope);
            st.setString(5, key);
            st.executeQuery().close();
        }
        HttpResponse<byte[]> late = doomed.get();
        pool.shutdown();
        assertProblem(late, 409, Problem.SUPERSEDED);
    }
}
