package example;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import dev.pgidempotency.DatabaseUrl;
import dev.pgidempotency.Json;
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
import java.sql.SQLException;
import java.sql.Statement;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;
import org.junit.jupiter.api.TestMethodOrder;

/**
 * The README's example apps, as they are (this module's OrdersApplication and OrdersServer), each
 * started as its own process the way the README says, against the tests' server, which these
 * tests restart, stop and start ($JAVA_PG_CTL):
 * <ul>
 *   <li>a fresh request, its replay (the same bytes), the same key with another body (422
 *   problem), no API key (401), an order the handler refuses (422: the key stays free);
 *   <li>the server restarted under the idle app: the next requests succeed, the first included
 *   (a pooled connection the restart closed is replaced, the claim made again);
 *   <li>stopped under the busy app: every answer is 201 or 503 problem+json with Retry-After, each
 *   503 within 2 s (the filter's own bound on waiting for a connection, whatever HikariCP's
 *   30 s), no other status; a key answered 503 has no row; started again: requests succeed, the
 *   keys refused meanwhile run once.
 * </ul>
 * Subclasses name the app; the test methods run in order, on one app process.
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
@TestMethodOrder(MethodOrderer.OrderAnnotation.class)
abstract class ExampleAppsTest {
    static final double BOUND_S = 2.0; // the contract's "503 within 2 s"
    /** What an exception escaping to the server would have written (Tomcat, Spring), or the filter's own errors. */
    static final List<String> UNHANDLED = List.of("Servlet.service()", "database error", "the handler failed");

    private final HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(5)).build();
    private Process app;
    private Path log;
    private String dbUrl; // the app's database, jdbc
    int port;

    /** The app's main class. */
    abstract String mainClass();

    /** JAVA_APPS_PORT + this (clients/java/test.sh's java-apps row; nothing else listens while this module runs). */
    abstract int portOffset();

    /** The app's environment, as the README says to start it. */
    abstract Map<String, String> environment(String postgresUrl, int port);

    static String env(String name) {
        String v = System.getenv(name);
        assumeTrue(v != null && !v.isEmpty(), name + " is not set: clients/java/test.sh starts the server and sets it");
        return v;
    }

    /** DATABASE_URL with another database. */
    static String withDatabase(String url, String db) {
        URI u = URI.create(url);
        return u.getScheme() + "://" + u.getRawAuthority() + "/" + db + (u.getRawQuery() == null ? "" : "?" + u.getRawQuery());
    }

    @BeforeAll
    void start() throws Exception {
        String base = env("DATABASE_URL");
        env("JAVA_PG_CTL");
        String db = "example_" + getClass().getSimpleName().toLowerCase();
        try (Connection c = DriverManager.getConnection(DatabaseUrl.toJdbc(base)); Statement st = c.createStatement()) {
            st.execute("DROP DATABASE IF EXISTS " + db + " WITH (FORCE)");
            st.execute("CREATE DATABASE " + db);
        }
        String url = withDatabase(base, db);
        dbUrl = DatabaseUrl.toJdbc(url);
        try (Connection c = DriverManager.getConnection(dbUrl); Statement st = c.createStatement()) {
            st.execute("CREATE EXTENSION idempotency");
        }
        String apps = System.getenv("JAVA_APPS_PORT");
        port = apps == null ? 20990 + portOffset() : Integer.parseInt(apps) + portOffset();
        String cp = "target/classes" + java.io.File.pathSeparator + Files.readString(Path.of("target/app-classpath.txt")).strip();
        log = Path.of("target", getClass().getSimpleName() + "-app.log");
        ProcessBuilder pb = new ProcessBuilder(ProcessHandle.current().info().command().orElse("java"), "-cp", cp, mainClass());
        pb.environment().putAll(environment(url, port));
        pb.redirectErrorStream(true).redirectOutput(log.toFile());
        app = pb.start();
        long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
        while (true) {
            assertTrue(app.isAlive(), "the app exited; see " + log);
            try {
                http.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + "/")).timeout(Duration.ofSeconds(2)).build(),
                        HttpResponse.BodyHandlers.discarding());
                return; // any answer: it listens
            } catch (IOException e) {
                assertTrue(System.nanoTime() < end, "the app did not answer in 60 s; see " + log);
                Thread.sleep(100);
            }
        }
    }

    @AfterAll
    void stop() throws Exception {
        if (app != null) {
            app.destroy();
            if (!app.waitFor(20, TimeUnit.SECONDS)) {
                app.destroyForcibly();
            }
        }
    }

    HttpResponse<byte[]> post(String tenant, String key, String body) {
        HttpRequest.Builder b = HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + "/orders"))
                .timeout(Duration.ofSeconds(30)).header("Content-Type", "application/json")
                .POST(HttpRequest.BodyPublishers.ofString(body));
        if (tenant != null) {
            b.header("X-Api-Key", tenant);
        }
        if (key != null) {
            b.header("Idempotency-Key", "\"" + key + "\"");
        }
        try {
            return http.send(b.build(), HttpResponse.BodyHandlers.ofByteArray());
        } catch (IOException e) {
            throw new IllegalStateException("no answer from the app (see " + log + "): " + e, e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException(e);
        }
    }

    HttpResponse<byte[]> order(String key) {
        return post("acct-example", key, "{\"item\": \"" + key + "\", \"quantity\": 1}");
    }

    static String text(HttpResponse<byte[]> r) {
        return r.statusCode() + " " + new String(r.body(), java.nio.charset.StandardCharsets.UTF_8);
    }

    static boolean replayed(HttpResponse<?> r) {
        return "true".equals(r.headers().firstValue("Idempotent-Replayed").orElse(null));
    }

    static String problemType(HttpResponse<byte[]> r) {
        return r.headers().firstValue("Content-Type").orElse("").startsWith("application/problem+json")
                ? (String) ((Map<?, ?>) Json.parse(r.body())).get("type") : null;
    }

    /** The contract's 503: problem+json service-unavailable with a Retry-After of whole seconds. */
    static boolean isUnavailable(HttpResponse<byte[]> r) {
        return r.statusCode() == 503 && "urn:pg-idempotency:problem:service-unavailable".equals(problemType(r))
                && r.headers().firstValue("Retry-After").orElse("").matches("[1-9][0-9]*");
    }

    /** Repeats a request while it answers 503, as a client honouring Retry-After does. */
    HttpResponse<byte[]> untilServed(String key) throws InterruptedException {
        long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
        while (true) {
            HttpResponse<byte[]> r = order(key);
            if (r.statusCode() != 503 || System.nanoTime() > end) {
                return r;
            }
            assertTrue(isUnavailable(r), text(r));
            Thread.sleep(1000L * Integer.parseInt(r.headers().firstValue("Retry-After").orElse("1")));
        }
    }

    Map<String, Integer> rows(List<String> items) throws SQLException {
        Map<String, Integer> out = new HashMap<>();
        items.forEach(i -> out.put(i, 0));
        try (Connection c = DriverManager.getConnection(dbUrl);
                PreparedStatement st = c.prepareStatement("SELECT item, count(*) FROM orders WHERE item = ANY (?) GROUP BY item")) {
            st.setArray(1, c.createArrayOf("text", items.toArray()));
            try (ResultSet rs = st.executeQuery()) {
                while (rs.next()) {
                    out.put(rs.getString(1), rs.getInt(2));
                }
            }
        }
        return out;
    }

    List<String> unhandled() throws IOException {
        return Files.readAllLines(log).stream().filter(l -> UNHANDLED.stream().anyMatch(l::contains)).toList();
    }

    static void pgCtl(String... args) throws IOException, InterruptedException {
        List<String> cmd = new ArrayList<>(List.of(env("JAVA_PG_CTL")));
        cmd.addAll(List.of(args));
        Process p = new ProcessBuilder(cmd).inheritIO().start();
        assertTrue(p.waitFor(90, TimeUnit.SECONDS) && p.exitValue() == 0, "pg_ctl " + String.join(" ", args));
    }

    static String newKey() {
        return UUID.randomUUID().toString();
    }

    @Test
    @Order(1)
    void aFreshRequestItsReplayAnotherBodyAndRefusals() throws Exception {
        String key = newKey();
        HttpResponse<byte[]> first = post("acct-42", key, "{\"item\": \"book-" + key + "\", \"quantity\": 1}");
        assertEquals(201, first.statusCode(), text(first));
        assertFalse(replayed(first));
        HttpResponse<byte[]> again = post("acct-42", key, "{\"item\": \"book-" + key + "\", \"quantity\": 1}");
        assertEquals(201, again.statusCode());
        assertTrue(replayed(again));
        assertArrayEquals(first.body(), again.body(), "the same bytes");
        HttpResponse<byte[]> other = post("acct-42", key, "{\"item\": \"pen\", \"quantity\": 1}");
        assertEquals(422, other.statusCode());
        assertEquals("urn:pg-idempotency:problem:idempotency-key-reused", problemType(other));
        assertEquals(Map.of("book-" + key, 1), rows(List.of("book-" + key)));

        assertEquals(401, post(null, newKey(), "{\"item\": \"x\", \"quantity\": 1}").statusCode(), "no API key");
        assertEquals(400, post("acct-42", null, "{\"item\": \"x\", \"quantity\": 1}").statusCode(), "no Idempotency-Key");
        String refused = newKey();
        assertEquals(422, post("acct-42", refused, "{\"item\": \"lamp-" + refused + "\", \"quantity\": 0}").statusCode());
        HttpResponse<byte[]> corrected = post("acct-42", refused, "{\"item\": \"lamp-" + refused + "\", \"quantity\": 2}");
        assertEquals(201, corrected.statusCode(), "the handler's 422 left the key free: " + text(corrected));
        assertFalse(replayed(corrected));
    }

    @Test
    @Order(2)
    void restartedUnderTheIdleAppNo503TheFirstRequestIncluded() throws Exception {
        ExecutorService clients = Executors.newFixedThreadPool(16);
        try {
            List<Future<HttpResponse<byte[]>>> warm = new ArrayList<>();
            for (int i = 0; i < 32; i++) { // several connections in the pool, then idle
                warm.add(clients.submit(() -> order(newKey())));
            }
            for (Future<HttpResponse<byte[]>> f : warm) {
                assertEquals(201, f.get().statusCode(), text(f.get()));
            }
            pgCtl("restart", "-m", "fast");
            HttpResponse<byte[]> first = order(newKey());
            assertEquals(201, first.statusCode(), "the first request after the restart: " + text(first));
            List<Future<HttpResponse<byte[]>>> after = new ArrayList<>();
            for (int i = 0; i < 32; i++) {
                after.add(clients.submit(() -> order(newKey())));
            }
            for (Future<HttpResponse<byte[]>> f : after) {
                assertEquals(201, f.get().statusCode(), text(f.get()));
            }
        } finally {
            clients.shutdownNow();
        }
        assertTrue(app.isAlive());
        assertEquals(List.of(), unhandled(), "see " + log);
    }

    private record Answer(String key, HttpResponse<byte[]> reply, long sentNanos, double tookSeconds) {}

    @Test
    @Order(3)
    void stoppedUnderTheBusyAppOnly503WithinTheBoundThenStarted() throws Exception {
        List<Answer> answers = Collections.synchronizedList(new ArrayList<>());
        AtomicBoolean done = new AtomicBoolean();
        List<Thread> clients = new ArrayList<>();
        for (int i = 0; i < 8; i++) {
            Thread t = new Thread(() -> {
                while (!done.get()) {
                    String key = newKey();
                    long sent = System.nanoTime();
                    HttpResponse<byte[]> r = order(key);
                    answers.add(new Answer(key, r, sent, (System.nanoTime() - sent) / 1e9));
                }
            });
            t.start();
            clients.add(t);
        }
        long stoppedAt;
        try {
            Thread.sleep(1500);
            pgCtl("stop", "-m", "fast");
            stoppedAt = System.nanoTime();
            Thread.sleep(3000);
        } catch (AssertionError | IOException e) {
            pgCtl("start");
            throw e;
        } finally {
            done.set(true);
            for (Thread t : clients) {
                t.join(60_000);
            }
        }
        List<Answer> refused;
        try {
            assertTrue(app.isAlive(), "the app died; see " + log);
            List<String> odd = answers.stream().filter(a -> a.reply().statusCode() != 201 && !isUnavailable(a.reply()))
                    .map(a -> text(a.reply())).limit(5).toList();
            assertEquals(List.of(), odd, "201 or the 503 problem, nothing else");
            refused = answers.stream().filter(a -> a.reply().statusCode() == 503).toList();
            long afterStop = answers.stream().filter(a -> a.sentNanos() > stoppedAt).count();
            assertTrue(!refused.isEmpty() && afterStop > 0, "no request while the database was down");
            List<Double> slow = refused.stream().map(Answer::tookSeconds).filter(s -> s >= BOUND_S).limit(5).toList();
            assertEquals(List.of(), slow, "503s slower than " + BOUND_S + " s");
        } finally {
            pgCtl("start");
        }
        HttpResponse<byte[]> back = untilServed(newKey());
        assertEquals(201, back.statusCode(), text(back));
        List<String> served = answers.stream().filter(a -> a.reply().statusCode() == 201).map(Answer::key).toList();
        assertTrue(rows(served).values().stream().allMatch(n -> n == 1), "a key answered 201 without its one row");
        List<String> refusedKeys = refused.stream().map(Answer::key).toList();
        assertTrue(rows(refusedKeys).values().stream().allMatch(n -> n == 0), "a key answered 503 has a row: something was done");
        for (String key : refusedKeys.subList(0, Math.min(10, refusedKeys.size()))) {
            HttpResponse<byte[]> r = untilServed(key); // the keys refused while the database was down now run, once
            assertEquals(201, r.statusCode(), text(r));
            assertFalse(replayed(r), key);
        }
        assertTrue(rows(refusedKeys.subList(0, Math.min(10, refusedKeys.size()))).values().stream().allMatch(n -> n == 1));
        assertEquals(List.of(), unhandled(), "see " + log);
    }
}
