package dev.pgidempotency;

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
import java.util.Collections;
import java.util.Comparator;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Optional;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
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
 * own and follows no redirect), each attempt bounded in total by the sender's timeout, or
 * through a function of yours.
 *
 * <p>The worker outlives its database: on any database error it logs it (System.Logger
 * {@value #LOGGER}, which is java.util.logging unless the application routes System.Logger
 * elsewhere), waits (exponential backoff with full jitter), reconnects and goes on.
 */
public final class Sender implements AutoCloseable {
    /** The channel {@code idem_send} notifies when a send is committed. */
    public static final String CHANNEL = "idempotency_send";
    /** A longer Retry-After is read as this (1000 years): past any give_up_at, within an interval. */
    public static final Duration MAX_RETRY_AFTER = Duration.ofDays(365_000);
    /**
     * The worker's logger (System.Logger; java.util.logging by default). A database error is logged
     * at WARNING with the {@link SQLException} as the record's thrown; the reconnection after it at
     * INFO with the message {@link #RECONNECTED}.
     */
    public static final String LOGGER = "dev.pgidempotency.Sender";
    /** The message of the record that says the worker works again after a database error. */
    public static final String RECONNECTED = "reconnected to the database";

    private static final System.Logger LOG = System.getLogger(LOGGER);

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
            setText(st, 6, giveUpAfter == null ? null : SendRules.intervalText(giveUpAfter));
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

    /** A database error's SQLSTATE, or its class when it has none (a connection refused). */
    public static String errorCode(SQLException e) {
        return SendRules.errorCode(e);
    }

    /** The first line of an error's message. */
    public static String firstLine(Throwable e) {
        return SendRules.firstLine(e);
    }

    private final DataSource db;
    private final Function<Attempt, Answer> send;
    private final Duration lease;
    private final int concurrency;
    private final Duration pollInterval;
    private final Map<String, String> settings;
    private final Duration giveUpAfter;
    private final Duration reconnectBase;
    private final Duration reconnectCap;
    private final BiConsumer<Attempt, Answer> onAttempt;
    private final BiConsumer<Attempt, SendResult> onFinished;
    private final ExecutorService pool;
    /** Answers the database went away before recording: recorded after reconnecting while their lease holds. */
    private final List<Kept> kept = new ArrayList<>();

    private record Kept(Attempt attempt, Answer answer, long leaseEndNanos) {}

    private Sender(Builder b) {
        this.db = b.db;
        this.lease = b.lease;
        this.concurrency = b.concurrency;
        this.pollInterval = b.pollInterval;
        this.settings = SendRules.settingValues(b.retryBudget, b.backoffBase, b.backoffCap);
        this.giveUpAfter = b.giveUpAfter == null ? null : SendRules.checkInterval("giveUpAfter", b.giveUpAfter);
        this.reconnectBase = b.reconnectBase;
        this.reconnectCap = b.reconnectCap;
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

    /**
     * The settings of a {@link Sender}. {@link #build} refuses (IllegalArgumentException) a timeout
     * that is not below the lease and a setting the extension would refuse.
     */
    public static final class Builder {
        private final DataSource db;
        private final Map<String, URI> urls = new HashMap<>();
        private final Map<String, Map<String, String>> headers = new HashMap<>();
        private Function<Attempt, Answer> send;
        private Duration timeout = Duration.ofSeconds(10);
        private Duration lease = Duration.ofSeconds(30);
        private int concurrency = 4;
        private Duration pollInterval = Duration.ofSeconds(1);
        private Double retryBudget;
        private Duration backoffBase;
        private Duration backoffCap;
        private Duration giveUpAfter;
        private Duration reconnectBase = Duration.ofMillis(100);
        private Duration reconnectCap = Duration.ofSeconds(5);
        private BiConsumer<Attempt, Answer> onAttempt = (a, b) -> {};
        private BiConsumer<Attempt, SendResult> onFinished = (a, r) -> {};

        private Builder(DataSource db) {
            this.db = java.util.Objects.requireNonNull(db, "db");
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

        /**
         * Your own transport: never throw, return {@link Answer#noAnswer} when no answer came, send
         * {@code keyHeader(a.key())}, and keep within the timeout (nothing bounds your function).
         */
        public Builder send(Function<Attempt, Answer> send) {
            this.send = send;
            return this;
        }

        /** Bounds one HTTP attempt in total, connecting, sending and the whole answer (default 10 s); below the lease. */
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

        /**
         * This sender's {@code idempotency.send_retry_budget} (0 to 1000000; null: the database's),
         * set with set_config(..., true) in each transaction that takes sends or records results.
         */
        public Builder retryBudget(Double budget) {
            this.retryBudget = budget;
            return this;
        }

        /** This sender's {@code idempotency.send_backoff_base} and {@code _cap} (null: the database's), set as the budget is. */
        public Builder backoff(Duration base, Duration cap) {
            this.backoffBase = base;
            this.backoffCap = cap;
            return this;
        }

        /** This sender's {@code give_up_after} for {@link Sender#prepare(Connection, String, String, String, String)} (null: the database's). */
        public Builder giveUpAfter(Duration d) {
            this.giveUpAfter = d;
            return this;
        }

        /** The worker's waits between reconnections: from 0 to min(cap, base * 2^(errors in a row - 1)) (100 ms, 5 s). */
        public Builder reconnectBackoff(Duration base, Duration cap) {
            this.reconnectBase = java.util.Objects.requireNonNull(base, "base");
            this.reconnectCap = java.util.Objects.requireNonNull(cap, "cap");
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
            SendRules.checkTimeout(timeout, lease);
            return new Sender(this);
        }
    }

    /** {@link #prepare(Connection, String, String, String, String, String, Duration)} with a new key and this sender's giveUpAfter. */
    public Prepared prepare(Connection tx, String scope, String operation, String target, String requestJson)
            throws SQLException {
        return prepare(tx, scope, operation, target, requestJson, null, giveUpAfter);
    }

    /**
     * One POST, bounded in total by {@code timeout}: the exchange is abandoned (its connection
     * closed) when the whole answer has not come by then, whatever the receiver does meanwhile (a
     * body a byte at a time keeps no per-read timeout from firing).
     */
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
        CompletableFuture<HttpResponse<String>> exchange = http.sendAsync(req.build(), HttpResponse.BodyHandlers.ofString());
        try {
            HttpResponse<String> r = exchange.get(timeout.toNanos(), TimeUnit.NANOSECONDS);
            Map<String, String> h = new HashMap<>();
            r.headers().map().forEach((k, v) -> h.put(k.toLowerCase(Locale.ROOT), String.join(", ", v)));
            return new Answer(r.statusCode(), h, r.body(), null);
        } catch (TimeoutException e) {
            exchange.cancel(true); // closes the connection
            return Answer.noAnswer("timed out after " + timeout.toMillis() + " ms");
        } catch (ExecutionException e) {
            Throwable cause = e.getCause();
            if (cause instanceof HttpTimeoutException) {
                return Answer.noAnswer("timed out after " + timeout.toMillis() + " ms");
            }
            if (cause instanceof ConnectException) {
                return Answer.noAnswer("connection failed: " + cause);
            }
            return Answer.noAnswer("no answer: " + cause); // reset, closed, refused by the HTTP layer
        } catch (InterruptedException e) {
            exchange.cancel(true);
            Thread.currentThread().interrupt();
            return Answer.noAnswer("interrupted");
        }
    }

    private Answer answer(Attempt a) {
        Answer answer;
        try {
            answer = send.apply(a);
        } catch (RuntimeException e) {
            answer = Answer.noAnswer(e.getClass().getSimpleName() + ": " + e.getMessage());
        }
        onAttempt.accept(a, answer);
        return answer;
    }

    /** One attempt of a send this sender holds, and its result recorded. */
    public SendResult attempt(Attempt a) throws SQLException {
        return record(a, answer(a));
    }

    /**
     * idem_send_result's arguments after the scope, operation and token, as text (null: NULL):
     * the status, the body, the headers as JSON, Retry-After as an interval, the error.
     */
    private static String[] resultText(Answer answer) {
        String status = null;
        String headersJson = null;
        String retryAfter = null;
        if (answer.status() != null) {
            status = answer.status().toString();
            headersJson = Json.write(new HashMap<String, Object>(answer.headers()));
            retryAfter = parseRetryAfter(answer.headers().get("retry-after"), ZonedDateTime.now())
                    .map(SendRules::intervalText).orElse(null);
        }
        return new String[] {status, answer.body(), headersJson, retryAfter, answer.error()};
    }

    private SendResult record(Attempt a, Answer answer) throws SQLException {
        String[] v = resultText(answer);
        String sql = """
                SELECT state, attempts, next_attempt_at
                FROM idempotency.idem_send_result(?, ?, ?::uuid, ?::int, ?, ?::jsonb, ?::interval, ?)""";
        Row row;
        try {
            row = call(sql, (st, i) -> {
                setText(st, i, a.scope());
                setText(st, i + 1, a.operation());
                setText(st, i + 2, a.token().toString());
                for (int k = 0; k < v.length; k++) {
                    setText(st, i + 3 + k, v[k]);
                }
            }, rs -> {
                rs.next();
                return Row.of(rs);
            });
        } catch (IdempotencyException.ClaimTakenOver e) {
            return new SendResult.Lost(a.scope(), a.operation());
        } catch (IdempotencyException.AlreadyCompleted e) {
            // Recorded already: the COMMIT's reply was lost with the connection.
            return status(a.scope(), a.operation()).orElseThrow(() -> e);
        }
        return recorded(a, answer, row);
    }

    /** What idem_send_result returned for one answer. */
    private record Row(String state, int attempts, OffsetDateTime nextAttemptAt) {
        static Row of(ResultSet rs) throws SQLException {
            return new Row(rs.getString(1), rs.getInt(2), rs.getObject(3, OffsetDateTime.class));
        }
    }

    /** The result of an answer that idem_send_result recorded. */
    private SendResult recorded(Attempt a, Answer answer, Row row) {
        SendResult result = switch (row.state()) {
            case "done" -> new SendResult.Delivered(answer.status(), answer.headers(), answer.body());
            case "gave_up" -> new SendResult.Unknown(a.key(), row.attempts(), answer.status(), answer.error());
            default -> new SendResult.NotYet(row.state(), row.attempts(), row.nextAttemptAt(), answer.status(),
                    answer.error());
        };
        if (!(result instanceof SendResult.NotYet)) {
            onFinished.accept(a, result);
        }
        return result;
    }

    /**
     * The answers of a round, recorded together ({@code answers.get(i)} is {@code taken.get(i)}'s):
     * one statement, so one round trip and one transaction, in (scope, operation) order (so that two
     * senders never lock rows in opposite orders). When the extension refuses one of them (IK002:
     * its lease was lost; IK003: recorded already) the statement records none, and each is recorded
     * on its own. The results are in {@code taken}'s order.
     */
    private List<SendResult> recordRound(List<Attempt> taken, List<Answer> answers) throws SQLException {
        List<Integer> order = new ArrayList<>();
        for (int i = 0; i < taken.size(); i++) {
            order.add(i);
        }
        order.sort(Comparator.comparing((Integer i) -> taken.get(i).scope())
                .thenComparing(i -> taken.get(i).operation()));
        int n = order.size();
        String[][] columns = new String[8][n];
        for (int k = 0; k < n; k++) {
            Attempt a = taken.get(order.get(k));
            String[] v = resultText(answers.get(order.get(k)));
            columns[0][k] = a.scope();
            columns[1][k] = a.operation();
            columns[2][k] = a.token().toString();
            for (int c = 0; c < v.length; c++) {
                columns[3 + c][k] = v[c];
            }
        }
        // The answers of a round in one statement, in the order given: idem_send_result once per
        // element of the arrays.
        String sql = """
                SELECT r.state, r.attempts, r.next_attempt_at
                FROM unnest(?::text[], ?::text[], ?::text[]::uuid[], ?::text[]::int[], ?::text[], ?::text[]::jsonb[],
                            ?::text[]::interval[], ?::text[])
                       WITH ORDINALITY AS a(scope, operation, token, http_status, response_body, response_headers,
                                            retry_after, error, n),
                     LATERAL idempotency.idem_send_result(a.scope, a.operation, a.token, a.http_status,
                                                          a.response_body, a.response_headers, a.retry_after,
                                                          a.error) AS r
                ORDER BY a.n""";
        SendResult[] results = new SendResult[n];
        List<Row> rows;
        try {
            rows = call(sql, (st, i) -> {
                for (int c = 0; c < columns.length; c++) {
                    st.setArray(i + c, st.getConnection().createArrayOf("text", columns[c]));
                }
            }, rs -> {
                List<Row> out = new ArrayList<>();
                while (rs.next()) {
                    out.add(Row.of(rs));
                }
                return out;
            });
        } catch (IdempotencyException.ClaimTakenOver | IdempotencyException.AlreadyCompleted e) {
            for (int i : order) {
                results[i] = record(taken.get(i), answers.get(i));
            }
            return List.of(results);
        }
        if (rows.size() != n) {
            throw new SQLException(n + " answers recorded, " + rows.size() + " results returned");
        }
        for (int k = 0; k < n; k++) {
            int i = order.get(k);
            results[i] = recorded(taken.get(i), answers.get(i), rows.get(k));
        }
        return List.of(results);
    }

    /** Due sends, and a System.nanoTime() instant at or before the end of their lease (it began after this). */
    private record Taken(List<Attempt> attempts, long leaseEndNanos) {}

    private Taken take(String target, int maxRows, String scope, String operation) throws SQLException {
        String sql = """
                SELECT scope, operation, target, key, request::text, attempt, token, locked_until, give_up_at
                FROM idempotency.idem_send_next(target => ?, max_rows => ?, lease => ?::interval, scope => ?,
                                                operation => ?)""";
        long before = System.nanoTime();
        List<Attempt> taken = call(sql, (st, i) -> {
            setText(st, i, target);
            st.setInt(i + 1, maxRows);
            setText(st, i + 2, SendRules.intervalText(lease));
            setText(st, i + 3, scope);
            setText(st, i + 4, operation);
        }, rs -> {
            List<Attempt> out = new ArrayList<>();
            while (rs.next()) {
                out.add(new Attempt(rs.getString(1), rs.getString(2), rs.getString(3), rs.getString(4),
                        rs.getString(5), rs.getInt(6), rs.getObject(7, UUID.class),
                        rs.getObject(8, OffsetDateTime.class), rs.getObject(9, OffsetDateTime.class)));
            }
            return out;
        });
        return new Taken(taken, before + lease.toNanos());
    }

    @FunctionalInterface
    private interface Binder {
        /** Binds the call's parameters, the first at index {@code first}. */
        void bind(PreparedStatement st, int first) throws SQLException;
    }

    @FunctionalInterface
    private interface Rows<T> {
        T read(ResultSet rs) throws SQLException;
    }

    /**
     * One call of the extension on a connection of the DataSource: in autocommit, or, with this
     * sender's settings, in a transaction of its own that sets them first (set_config(..., true),
     * so they hold through PgBouncer's transaction pooling and nowhere else): BEGIN, set_config, the
     * call and COMMIT in one round trip.
     */
    private <T> T call(String sql, Binder bind, Rows<T> rows) throws SQLException {
        try (Connection c = db.getConnection()) {
            if (settings.isEmpty()) {
                try (PreparedStatement st = c.prepareStatement(sql)) {
                    bind.bind(st, 1);
                    try (ResultSet rs = st.executeQuery()) {
                        return rows.read(rs);
                    }
                }
            }
            String set = "SELECT " + String.join(", ", Collections.nCopies(settings.size(), "set_config(?, ?, true)"));
            c.setAutoCommit(false);
            try (PreparedStatement st = c.prepareStatement(set + ";\n" + sql + ";\nCOMMIT")) {
                int i = 1;
                for (Map.Entry<String, String> e : settings.entrySet()) {
                    st.setString(i++, e.getKey());
                    st.setString(i++, e.getValue());
                }
                bind.bind(st, i);
                st.execute();
                st.getMoreResults();
                try (ResultSet rs = st.getResultSet()) {
                    return rows.read(rs);
                }
            } catch (SQLException e) {
                rollbackQuietly(c);
                throw e;
            } finally {
                autocommitQuietly(c);
            }
        } catch (SQLException e) {
            throw IdempotencyException.of(e);
        }
    }

    /**
     * Right after the COMMIT that prepared it: one attempt of this send, if it is due and no
     * other sender holds it; otherwise (or after a retryable answer) where it is now. The retries
     * are the worker's. Throws {@link IllegalArgumentException} when the operation was never
     * prepared; a database error is thrown (the worker takes the send again when its lease ends).
     */
    public SendResult deliver(String scope, String operation) throws SQLException {
        List<Attempt> taken = take(null, 1, scope, operation).attempts();
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

    /**
     * One round: up to {@code concurrency} due sends of {@code target} (null: any), attempted at
     * once; once every attempt has ended their answers are recorded together (one statement, one
     * round trip; a round of one: the single call). Returns how many. A database error is thrown;
     * the answers it kept from being recorded are recorded by the worker when it has reconnected
     * (while their lease holds).
     */
    public int runOnce(String target) throws SQLException {
        Taken taken = take(target, concurrency, null, null);
        List<Attempt> attempts = taken.attempts();
        List<Future<Answer>> running = new ArrayList<>();
        for (Attempt a : attempts) {
            running.add(pool.submit(() -> answer(a)));
        }
        List<Answer> answers = new ArrayList<>();
        boolean interrupted = false;
        for (Future<Answer> f : running) {
            while (true) {
                try {
                    answers.add(f.get());
                    break;
                } catch (ExecutionException e) { // an Error out of the send function: no answer
                    answers.add(Answer.noAnswer(e.getCause().getClass().getSimpleName() + ": "
                            + e.getCause().getMessage()));
                    break;
                } catch (InterruptedException e) { // the attempts in flight are recorded first
                    interrupted = true;
                }
            }
        }
        if (interrupted) {
            Thread.currentThread().interrupt();
        }
        try {
            if (attempts.size() == 1) {
                record(attempts.get(0), answers.get(0));
            } else if (!attempts.isEmpty()) {
                recordRound(attempts, answers);
            }
        } catch (SQLException e) {
            synchronized (kept) {
                for (int i = 0; i < attempts.size(); i++) {
                    kept.add(new Kept(attempts.get(i), answers.get(i), taken.leaseEndNanos()));
                }
            }
            throw e;
        }
        return attempts.size();
    }

    /** Records the kept answers whose lease still holds; the others are left to be taken again. */
    private void recordKept() throws SQLException {
        List<Kept> all;
        synchronized (kept) {
            all = new ArrayList<>(kept);
            kept.clear();
        }
        for (int i = 0; i < all.size(); i++) {
            Attempt a = all.get(i).attempt();
            if (System.nanoTime() - all.get(i).leaseEndNanos() >= 0) {
                LOG.log(System.Logger.Level.INFO, "the answer to {0} / {1} (attempt {2}) was not recorded before its"
                        + " lease ended: the send is left to be taken again", a.scope(), a.operation(), a.attempt());
                continue;
            }
            try {
                record(a, all.get(i).answer());
            } catch (SQLException e) {
                synchronized (kept) {
                    kept.addAll(0, all.subList(i, all.size()));
                }
                throw e;
            }
            LOG.log(System.Logger.Level.INFO, "recorded the answer to {0} / {1} (attempt {2}) after reconnecting",
                    a.scope(), a.operation(), a.attempt());
        }
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
     * when {@code stop} says so (checked between rounds and during waits: the attempts in flight
     * are recorded first) or, with {@code untilIdle}, when nothing of the target is left to send.
     *
     * <p>A database error (the backend terminated, the server restarting or down, a failover, a
     * deadlock, a serialization failure) does not end it: it is logged ({@value #LOGGER}, WARNING,
     * the SQLException as the record's thrown), the LISTEN connection is closed, and after a wait
     * of exponential backoff with full jitter ({@link Builder#reconnectBackoff}) the worker takes
     * connections again (INFO, {@link #RECONNECTED}), records the answers the error kept from being
     * recorded while their lease holds, and goes on.
     */
    public void run(String target, boolean untilIdle, BooleanSupplier stop) {
        Listener listener = null;
        int failures = 0;
        try {
            while (!stop.getAsBoolean()) {
                try {
                    if (listener == null) {
                        listener = Listener.open(db);
                        if (failures > 0) {
                            LOG.log(System.Logger.Level.INFO, RECONNECTED);
                        }
                        recordKept();
                    }
                    int worked = runOnce(target);
                    failures = 0;
                    if (worked > 0) {
                        continue;
                    }
                    if (untilIdle && idle(target)) {
                        return;
                    }
                    listener.await(pollInterval, stop);
                } catch (SQLException e) {
                    failures++;
                    long delay = SendRules.reconnectDelayMillis(failures, reconnectBase, reconnectCap,
                            ThreadLocalRandom.current()::nextDouble);
                    LOG.log(System.Logger.Level.WARNING, "database error (" + errorCode(e) + "): " + firstLine(e)
                            + "; reconnecting in " + delay + " ms", e);
                    if (listener != null) {
                        listener.close();
                        listener = null;
                    }
                    Listener.pause(delay, stop);
                }
            }
        } finally {
            if (listener != null) {
                listener.close();
            }
        }
    }

    /** Stops the attempts' threads (after the ones running). */
    @Override
    public void close() {
        pool.shutdown();
    }

    /** A LISTEN session (pgjdbc), or a plain sleep when the driver is not pgjdbc. */
    private static final class Listener {
        /** The longest single wait, so that a stop is seen soon. */
        private static final long SLICE_MS = 100;
        private final Connection conn;

        private Listener(Connection conn) {
            this.conn = conn;
        }

        /** Takes a connection and LISTENs on it (pgjdbc); otherwise checks one works and gives it back. */
        static Listener open(DataSource db) throws SQLException {
            Connection c = db.getConnection();
            try {
                if (isPgjdbc(c)) {
                    try (Statement st = c.createStatement()) {
                        st.execute("LISTEN " + CHANNEL);
                    }
                    if (!c.getAutoCommit()) {
                        c.commit();
                    }
                    return new Listener(c);
                }
                try (Statement st = c.createStatement()) {
                    st.execute("SELECT 1");
                }
            } catch (SQLException | RuntimeException e) {
                closeQuietly(c);
                throw e;
            }
            closeQuietly(c);
            return new Listener(null);
        }

        private static boolean isPgjdbc(Connection c) throws SQLException {
            try {
                return c.isWrapperFor(org.postgresql.PGConnection.class);
            } catch (NoClassDefFoundError e) {
                return false; // not pgjdbc: poll only
            }
        }

        /** Waits for a NOTIFY, the poll interval, or the stop; a database error is thrown. */
        void await(Duration d, BooleanSupplier stop) throws SQLException {
            long end = System.nanoTime() + d.toNanos();
            for (long left = d.toMillis(); left > 0 && !stop.getAsBoolean();
                    left = TimeUnit.NANOSECONDS.toMillis(end - System.nanoTime())) {
                int slice = (int) Math.max(1, Math.min(SLICE_MS, left));
                if (conn == null) {
                    sleep(slice);
                } else if (conn.unwrap(org.postgresql.PGConnection.class).getNotifications(slice).length > 0) {
                    return;
                }
            }
        }

        /** Sleeps {@code ms}, or less when the stop comes. */
        static void pause(long ms, BooleanSupplier stop) {
            long end = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(ms);
            for (long left = ms; left > 0 && !stop.getAsBoolean();
                    left = TimeUnit.NANOSECONDS.toMillis(end - System.nanoTime())) {
                sleep(Math.min(SLICE_MS, left));
            }
        }

        private static void sleep(long ms) {
            try {
                Thread.sleep(ms);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }

        /** Closes its connection (UNLISTEN first when it still works). */
        void close() {
            if (conn != null) {
                try (Statement st = conn.createStatement()) {
                    st.execute("UNLISTEN " + CHANNEL);
                } catch (SQLException e) {
                    LOG.log(System.Logger.Level.DEBUG, "UNLISTEN failed (the connection is closed anyway)", e);
                }
                closeQuietly(conn);
            }
        }
    }

    private static void closeQuietly(Connection c) {
        try {
            c.close();
        } catch (SQLException e) {
            LOG.log(System.Logger.Level.DEBUG, "closing a connection failed", e);
        }
    }

    private static void rollbackQuietly(Connection c) {
        try {
            c.rollback();
        } catch (SQLException e) {
            LOG.log(System.Logger.Level.DEBUG, "rollback failed", e);
        }
    }

    private static void autocommitQuietly(Connection c) {
        try {
            c.setAutoCommit(true);
        } catch (SQLException e) {
            LOG.log(System.Logger.Level.DEBUG, "setAutoCommit(true) failed", e);
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
