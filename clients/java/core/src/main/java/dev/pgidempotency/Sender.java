package dev.pgidempotency;

import java.io.IOException;
import java.math.BigInteger;
import java.net.ConnectException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.net.http.HttpTimeoutException;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.sql.Types;
import java.time.Duration;
import java.time.OffsetDateTime;
import java.time.ZonedDateTime;
import java.time.format.DateTimeFormatter;
import java.time.format.DateTimeParseException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Optional;
import java.util.UUID;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.function.BiConsumer;
import java.util.function.BooleanSupplier;
import java.util.function.Function;
import javax.sql.DataSource;

/**
 * The sending side (docs/sending.md): a request to another service with an Idempotency-Key made
 * once per business operation and kept in your database. {@link #prepare} runs in your
 * transaction; a Sender delivers right after COMMIT ({@link #deliver}, one attempt) or runs as a
 * worker ({@link #run}: retries with backoff, jitter and the retry budget, all decided by the
 * extension). HTTP goes through {@link java.net.http.HttpClient} (it never resends a POST on its
 * own and follows no redirect) or through a function of yours.
 */
public final class Sender implements AutoCloseable {
    /** The channel {@code idem_send} notifies when a send is committed. */
    public static final String CHANNEL = "idempotency_send";
    /** A longer Retry-After is read as this (1000 years): past any give_up_at, within an interval. */
    public static final Duration MAX_RETRY_AFTER = Duration.ofDays(365_000);

    /** What {@code idem_send} recorded (or found: the same operation prepared before). */
    public record Prepared(String key, String state, int attempts, OffsetDateTime nextAttemptAt,
            SendResult.Delivered response) {}

    /** One send handed out by {@code idem_send_next}; {@code requestJson} null for none; attempt 1 is the first. */
    public record Attempt(String scope, String operation, String target, String key, String requestJson, int attempt,
            UUID token, OffsetDateTime lockedUntil, OffsetDateTime giveUpAt) {}

    /** What one attempt got: {@code status} null means no answer ({@code error} says why). Header names in lower case. */
    public record Answer(Integer status, Map<String, String> headers, String body, String error) {
        public static Answer noAnswer(String error) {
            return new Answer(null, Map.of(), null, error);
        }
    }

    /**
     * {@code idem_send} in the caller's open transaction (it never commits): records the send and
     * returns its key. The same operation again returns the same row; another request, target or
     * key for it throws {@link IdempotencyException.OperationReused} (IK004). {@code key} and
     * {@code giveUpAfter} may be null (a new UUID; {@code idempotency.send_give_up_after}).
     */
    public static Prepared prepare(Connection tx, String scope, String operation, String target, String requestJson,
            String key, Duration giveUpAfter) throws SQLException {
        String sql = """
                SELECT key, state, attempts, next_attempt_at, response_status, response_body, response_headers::text
                FROM idempotency.idem_send(?, ?, ?, ?::jsonb, ?, ?::interval)""";
        try (PreparedStatement st = tx.prepareStatement(sql)) {
            setText(st, 1, scope);
            setText(st, 2, operation);
            setText(st, 3, target);
            setText(st, 4, requestJson);
            setText(st, 5, key);
            setText(st, 6, IdempotencyClient.interval(giveUpAfter));
            try (ResultSet rs = st.executeQuery()) {
                rs.next();
                String state = rs.getString(2);
                SendResult.Delivered response = "done".equals(state)
                        ? new SendResult.Delivered(rs.getInt(5), headerMap(rs.getString(7)), rs.getString(6))
                        : null;
                return new Prepared(rs.getString(1), state, rs.getInt(3), rs.getObject(4, OffsetDateTime.class),
                        response);
            }
        } catch (SQLException e) {
            throw IdempotencyException.of(e);
        }
    }

    /** The Idempotency-Key header's value: an RFC 8941 sf-string. */
    public static String keyHeader(String key) {
        return '"' + key.replace("\\", "\\\\").replace("\"", "\\\"") + '"';
    }

    /** Retry-After as delta-seconds or an HTTP date (at most {@link #MAX_RETRY_AFTER}); empty when unreadable. */
    public static Optional<Duration> parseRetryAfter(String value, ZonedDateTime now) {
        if (value == null || value.isBlank()) {
            return Optional.empty();
        }
        String v = value.strip();
        if (v.chars().allMatch(c -> c >= '0' && c <= '9')) {
            BigInteger secs = new BigInteger(v);
            BigInteger max = BigInteger.valueOf(MAX_RETRY_AFTER.toSeconds());
            return Optional.of(Duration.ofSeconds(secs.min(max).longValueExact()));
        }
        try {
            ZonedDateTime when = ZonedDateTime.parse(v, DateTimeFormatter.RFC_1123_DATE_TIME);
            Duration d = Duration.between(now, when);
            return Optional.of(d.isNegative() ? Duration.ZERO : d.compareTo(MAX_RETRY_AFTER) > 0 ? MAX_RETRY_AFTER : d);
        } catch (DateTimeParseException e) {
            return Optional.empty();
        }
    }

    private final DataSource db;
    private final Function<Attempt, Answer> send;
    private final Duration lease;
    private final int concurrency;
    private final Duration pollInterval;
    private final BiConsumer<Attempt, Answer> onAttempt;
    private final BiConsumer<Attempt, SendResult> onFinished;
    private final ExecutorService pool;

    private Sender(Builder b) {
        this.db = b.db;
        this.lease = b.lease;
        this.concurrency = b.concurrency;
        this.pollInterval = b.pollInterval;
        this.onAttempt = b.onAttempt;
        this.onFinished = b.onFinished;
        if (b.send != null) {
            this.send = b.send;
        } else {
            HttpClient http = HttpClient.newBuilder().connectTimeout(b.timeout)
                    .followRedirects(HttpClient.Redirect.NEVER).build();
            Map<String, URI> urls = Map.copyOf(b.urls);
            Map<String, Map<String, String>> headers = Map.copyOf(b.headers);
            Duration timeout = b.timeout;
            this.send = a -> post(http, urls, headers, timeout, a);
        }
        this.pool = Executors.newFixedThreadPool(concurrency, r -> {
            Thread t = new Thread(r, "idempotency-sender");
            t.setDaemon(true);
            return t;
        });
    }

    /** A sender whose statements run on connections of {@code db} (autocommit). */
    public static Builder builder(DataSource db) {
        return new Builder(db);
    }

    /** The settings of a {@link Sender}. */
    public static final class Builder {
        private final DataSource db;
        private final Map<String, URI> urls = new HashMap<>();
        private final Map<String, Map<String, String>> headers = new HashMap<>();
        private Function<Attempt, Answer> send;
        private Duration timeout = Duration.ofSeconds(10);
        private Duration lease = Duration.ofSeconds(30);
        private int concurrency = 4;
        private Duration pollInterval = Duration.ofSeconds(1);
        private BiConsumer<Attempt, Answer> onAttempt = (a, b) -> {};
        private BiConsumer<Attempt, SendResult> onFinished = (a, r) -> {};

        private Builder(DataSource db) {
            this.db = db;
        }

        /** POST the requests of {@code target} to {@code url} (the request as JSON). */
        public Builder url(String target, String url) {
            urls.put(target, URI.create(url));
            return this;
        }

        /** An extra header on every request to {@code target} (its credentials, say). */
        public Builder header(String target, String name, String value) {
            headers.computeIfAbsent(target, t -> new HashMap<>()).put(name, value);
            return this;
        }

        /** Your own transport: never throw, return {@link Answer#noAnswer} when no answer came; send {@code keyHeader(a.key())}. */
        public Builder send(Function<Attempt, Answer> send) {
            this.send = send;
            return this;
        }

        /** Bounds one HTTP attempt (default 10 s); shorter than the lease. */
        public Builder timeout(Duration d) {
            this.timeout = d;
            return this;
        }

        /** How long a sender holds a send before another may take it over (default 30 s). */
        public Builder lease(Duration d) {
            this.lease = d;
            return this;
        }

        /** Sends attempted at once by the worker (default 4). */
        public Builder concurrency(int n) {
            this.concurrency = Math.max(1, n);
            return this;
        }

        /** How often the worker looks for retries that became due (default 1 s). */
        public Builder pollInterval(Duration d) {
            this.pollInterval = d;
            return this;
        }

        public Builder onAttempt(BiConsumer<Attempt, Answer> f) {
            this.onAttempt = f;
            return this;
        }

        /** Called when an attempt's result finished the send (delivered, or gave up). */
        public Builder onFinished(BiConsumer<Attempt, SendResult> f) {
            this.onFinished = f;
            return this;
        }

        public Sender build() {
            if (send == null && urls.isEmpty()) {
                throw new IllegalArgumentException("give a URL per target or a send function");
            }
            if (timeout.compareTo(lease) >= 0) {
                throw new IllegalArgumentException("the timeout must be shorter than the lease");
            }
            return new Sender(this);
        }
    }

    private static Answer post(HttpClient http, Map<String, URI> urls, Map<String, Map<String, String>> headers,
            Duration timeout, Attempt a) {
        URI url = urls.get(a.target());
        if (url == null) {
            return Answer.noAnswer("no URL for target " + a.target());
        }
        HttpRequest.Builder req = HttpRequest.newBuilder(url).timeout(timeout)
                .POST(HttpRequest.BodyPublishers.ofString(a.requestJson() == null ? "null" : a.requestJson()));
        headers.getOrDefault(a.target(), Map.of()).forEach(req::header);
        req.header("Idempotency-Key", keyHeader(a.key())).header("Content-Type", "application/json");
        try {
            HttpResponse<String> r = http.send(req.build(), HttpResponse.BodyHandlers.ofString());
            Map<String, String> h = new HashMap<>();
            r.headers().map().forEach((k, v) -> h.put(k.toLowerCase(Locale.ROOT), String.join(", ", v)));
            return new Answer(r.statusCode(), h, r.body(), null);
        } catch (HttpTimeoutException e) {
            return Answer.noAnswer("timed out");
        } catch (ConnectException e) {
            return Answer.noAnswer("connection failed: " + e);
        } catch (IOException e) {
            return Answer.noAnswer("no answer: " + e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return Answer.noAnswer("interrupted");
        }
    }

    /** One attempt of a send this sender holds, and its result recorded. */
    public SendResult attempt(Attempt a) throws SQLException {
        Answer answer;
        try {
            answer = send.apply(a);
        } catch (RuntimeException e) {
            answer = Answer.noAnswer(e.getClass().getSimpleName() + ": " + e.getMessage());
        }
        onAttempt.accept(a, answer);
        return record(a, answer);
    }

    private SendResult record(Attempt a, Answer answer) throws SQLException {
        String retryAfter = null;
        String headersJson = null;
        if (answer.status() != null) {
            headersJson = Json.write(new HashMap<String, Object>(answer.headers()));
            retryAfter = IdempotencyClient.interval(parseRetryAfter(answer.headers().get("retry-after"),
                    ZonedDateTime.now()).orElse(null));
        }
        String sql = """
                SELECT state, attempts, next_attempt_at
                FROM idempotency.idem_send_result(?, ?, ?::uuid, ?, ?, ?::jsonb, ?::interval, ?)""";
        String state;
        int attempts;
        OffsetDateTime next;
        try (Connection c = db.getConnection(); PreparedStatement st = c.prepareStatement(sql)) {
            setText(st, 1, a.scope());
            setText(st, 2, a.operation());
            setText(st, 3, a.token().toString());
            if (answer.status() == null) {
                st.setNull(4, Types.INTEGER);
            } else {
                st.setInt(4, answer.status());
            }
            setText(st, 5, answer.body());
            setText(st, 6, headersJson);
            setText(st, 7, retryAfter);
            setText(st, 8, answer.error());
            try (ResultSet rs = st.executeQuery()) {
                rs.next();
                state = rs.getString(1);
                attempts = rs.getInt(2);
                next = rs.getObject(3, OffsetDateTime.class);
            }
        } catch (SQLException e) {
            SQLException typed = IdempotencyException.of(e);
            if (typed instanceof IdempotencyException.ClaimTakenOver) {
                return new SendResult.Lost(a.scope(), a.operation());
            }
            throw typed;
        }
        SendResult result = switch (state) {
            case "done" -> new SendResult.Delivered(answer.status(), answer.headers(), answer.body());
            case "gave_up" -> new SendResult.Unknown(a.key(), attempts, answer.status(), answer.error());
            default -> new SendResult.NotYet(state, attempts, next, answer.status(), answer.error());
        };
        if (!(result instanceof SendResult.NotYet)) {
            onFinished.accept(a, result);
        }
        return result;
    }

    private List<Attempt> take(String target, int maxRows, String scope, String operation) throws SQLException {
        String sql = """
                SELECT scope, operation, target, key, request::text, attempt, token, locked_until, give_up_at
                FROM idempotency.idem_send_next(target => ?, max_rows => ?, lease => ?::interval, scope => ?,
                                                operation => ?)""";
        List<Attempt> taken = new ArrayList<>();
        try (Connection c = db.getConnection(); PreparedStatement st = c.prepareStatement(sql)) {
            setText(st, 1, target);
            st.setInt(2, maxRows);
            setText(st, 3, IdempotencyClient.interval(lease));
            setText(st, 4, scope);
            setText(st, 5, operation);
            try (ResultSet rs = st.executeQuery()) {
                while (rs.next()) {
                    taken.add(new Attempt(rs.getString(1), rs.getString(2), rs.getString(3), rs.getString(4),
                            rs.getString(5), rs.getInt(6), rs.getObject(7, UUID.class),
                            rs.getObject(8, OffsetDateTime.class), rs.getObject(9, OffsetDateTime.class)));
                }
            }
        } catch (SQLException e) {
            throw IdempotencyException.of(e);
        }
        return taken;
    }

    /**
     * Right after the COMMIT that prepared it: one attempt of this send, if it is due and no
     * other sender holds it; otherwise (or after a retryable answer) where it is now. The retries
     * are the worker's. Throws {@link IllegalArgumentException} when the operation was never prepared.
     */
    public SendResult deliver(String scope, String operation) throws SQLException {
        List<Attempt> taken = take(null, 1, scope, operation);
        if (!taken.isEmpty()) {
            return attempt(taken.get(0));
        }
        return status(scope, operation).orElseThrow(() -> new IllegalArgumentException(
                "no outbound record for operation " + operation + " in scope " + scope));
    }

    /** Where the send is now, from its row; empty when there is none. */
    public Optional<SendResult> status(String scope, String operation) throws SQLException {
        String sql = """
                SELECT state, attempts, next_attempt_at, last_status, last_error, response_status, response_body,
                       response_headers::text, key
                FROM idempotency.outbound WHERE scope = ? AND operation = ?""";
        try (Connection c = db.getConnection(); PreparedStatement st = c.prepareStatement(sql)) {
            setText(st, 1, scope);
            setText(st, 2, operation);
            try (ResultSet rs = st.executeQuery()) {
                if (!rs.next()) {
                    return Optional.empty();
                }
                Integer lastStatus = (Integer) rs.getObject(4);
                return Optional.of(switch (rs.getString(1)) {
                    case "done" -> new SendResult.Delivered(rs.getInt(6), headerMap(rs.getString(8)), rs.getString(7));
                    case "gave_up" -> new SendResult.Unknown(rs.getString(9), rs.getInt(2), lastStatus, rs.getString(5));
                    default -> new SendResult.NotYet(rs.getString(1), rs.getInt(2),
                            rs.getObject(3, OffsetDateTime.class), lastStatus, rs.getString(5));
                });
            }
        } catch (SQLException e) {
            throw IdempotencyException.of(e);
        }
    }

    /** One round: up to {@code concurrency} due sends of {@code target} (null: any), at once. Returns how many. */
    public int runOnce(String target) throws SQLException {
        List<Attempt> taken = take(target, concurrency, null, null);
        List<Future<SendResult>> running = new ArrayList<>();
        for (Attempt a : taken) {
            running.add(pool.submit(() -> attempt(a)));
        }
        SQLException failed = null;
        for (Future<SendResult> f : running) {
            try {
                f.get();
            } catch (ExecutionException e) {
                if (failed == null) {
                    failed = e.getCause() instanceof SQLException s ? s : new SQLException(e.getCause());
                }
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
        if (failed != null) {
            throw failed;
        }
        return taken.size();
    }

    /** No send of {@code target} (null: of any target) is pending or sending. */
    public boolean idle(String target) throws SQLException {
        String sql = """
                SELECT NOT EXISTS (SELECT FROM idempotency.outbound
                                    WHERE state IN ('pending', 'sending') AND (?::text IS NULL OR target = ?))""";
        try (Connection c = db.getConnection(); PreparedStatement st = c.prepareStatement(sql)) {
            setText(st, 1, target);
            setText(st, 2, target);
            try (ResultSet rs = st.executeQuery()) {
                rs.next();
                return rs.getBoolean(1);
            }
        }
    }

    /**
     * The worker: rounds of {@link #runOnce} while there is due work; between them it waits for a
     * NOTIFY on {@code idempotency_send} (on a connection of its own from the DataSource, when the
     * driver is pgjdbc; not through PgBouncer's transaction pooling) or the poll interval. Returns
     * when {@code stop} says so (checked between rounds: the attempts in flight are recorded) or,
     * with {@code untilIdle}, when nothing of the target is left to send.
     */
    public void run(String target, boolean untilIdle, BooleanSupplier stop) throws SQLException {
        try (Listener listener = Listener.open(db)) {
            while (!stop.getAsBoolean()) {
                if (runOnce(target) > 0) {
                    continue;
                }
                if (untilIdle && idle(target)) {
                    return;
                }
                listener.await(pollInterval);
            }
        }
    }

    /** Stops the attempts' threads (after the ones running). */
    @Override
    public void close() {
        pool.shutdown();
    }

    /** A LISTEN session (pgjdbc), or a plain sleep when the driver is not pgjdbc. */
    private static final class Listener implements AutoCloseable {
        private final Connection conn;

        private Listener(Connection conn) {
            this.conn = conn;
        }

        static Listener open(DataSource db) throws SQLException {
            Connection c = db.getConnection();
            try {
                if (c.isWrapperFor(org.postgresql.PGConnection.class)) {
                    try (Statement st = c.createStatement()) {
                        st.execute("LISTEN " + CHANNEL);
                    }
                    if (!c.getAutoCommit()) {
                        c.commit();
                    }
                    return new Listener(c);
                }
            } catch (NoClassDefFoundError e) {
                // not pgjdbc: poll only
            }
            c.close();
            return new Listener(null);
        }

        void await(Duration d) throws SQLException {
            int ms = (int) Math.max(1, Math.min(Integer.MAX_VALUE, d.toMillis()));
            if (conn == null) {
                sleep(ms);
                return;
            }
            conn.unwrap(org.postgresql.PGConnection.class).getNotifications(ms);
        }

        private static void sleep(int ms) {
            try {
                Thread.sleep(ms);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }

        @Override
        public void close() throws SQLException {
            if (conn != null) {
                try (Statement st = conn.createStatement()) {
                    st.execute("UNLISTEN " + CHANNEL);
                } finally {
                    conn.close();
                }
            }
        }
    }

    private static void setText(PreparedStatement st, int i, String v) throws SQLException {
        if (v == null) {
            st.setNull(i, Types.VARCHAR);
        } else {
            st.setString(i, v);
        }
    }

    @SuppressWarnings("unchecked")
    private static Map<String, String> headerMap(String json) {
        Map<String, String> out = new HashMap<>();
        if (json == null) {
            return out;
        }
        if (Json.parse(json) instanceof Map<?, ?> m) {
            ((Map<String, Object>) m).forEach((k, v) -> out.put(k.toLowerCase(Locale.ROOT),
                    v instanceof String s ? s : Json.write(v)));
        }
        return out;
    }
}
