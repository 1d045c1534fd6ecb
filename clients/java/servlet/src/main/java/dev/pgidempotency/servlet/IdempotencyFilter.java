package dev.pgidempotency.servlet;

import dev.pgidempotency.Claim;
import dev.pgidempotency.ClaimOptions;
import dev.pgidempotency.Fingerprint;
import dev.pgidempotency.IdempotencyClient;
import dev.pgidempotency.IdempotencyException;
import dev.pgidempotency.Json;
import dev.pgidempotency.Outcome;
import dev.pgidempotency.http.HttpAnswer;
import dev.pgidempotency.http.HttpProblemException;
import dev.pgidempotency.http.IdempotencyKey;
import dev.pgidempotency.http.Problem;
import dev.pgidempotency.http.StoredResponse;
import jakarta.servlet.Filter;
import jakarta.servlet.FilterChain;
import jakarta.servlet.ServletException;
import jakarta.servlet.ServletRequest;
import jakarta.servlet.ServletResponse;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.IOException;
import java.sql.Connection;
import java.sql.SQLException;
import java.sql.SQLTransientConnectionException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import javax.sql.DataSource;

/**
 * Idempotency-Key handling for any Jakarta Servlet 6 container, no framework needed. For each
 * request matching one of its routes: key, scope, fingerprint, claim, then the handler in one of
 * the two {@link Mode}s, the response stored (or the key given back) and sent; duplicates get the
 * stored response, 409, 422 or 410 (problem+json, RFC 9457). Built with {@link #builder}.
 */
public final class IdempotencyFilter implements Filter {
    private static final System.Logger LOG = System.getLogger(IdempotencyFilter.class.getName());
    public static final String KEY_HEADER = "Idempotency-Key";
    /** How long a request waits for a connection unless told otherwise ({@link Builder#connectionTimeout}). */
    public static final Duration DEFAULT_CONNECTION_TIMEOUT = Duration.ofSeconds(1);

    /** The tenant of a request (a prefix of the scope), or null; may throw {@link HttpProblemException} (401). */
    @FunctionalInterface
    public interface Tenant {
        String of(HttpServletRequest request);
    }

    /**
     * Same-transaction mode: makes the claim's connection the one the application's own data access
     * uses during the handler (Spring binds it to its transaction synchronization); returns the undo.
     */
    @FunctionalInterface
    public interface TransactionBinding {
        Runnable bind(Connection connection);
    }

    private final BoundedConnections connections;
    private final IdempotencyClient client;
    private final Map<RouteTemplate, RouteOptions> routes;
    private final Tenant tenant;
    private final TransactionBinding binding;
    private final ScheduledExecutorService timer;

    private IdempotencyFilter(Builder b) {
        this.connections = new BoundedConnections(b.dataSource, b.connectionTimeout);
        this.client = b.client;
        this.routes = Collections.unmodifiableMap(new java.util.LinkedHashMap<>(b.routes));
        this.tenant = b.tenant;
        this.binding = b.binding;
        // A few threads: a renewal stuck on an unreachable database does not hold up the others.
        this.timer = Executors.newScheduledThreadPool(4, r -> {
            Thread t = new Thread(r, "pg-idempotency-lease");
            t.setDaemon(true);
            return t;
        });
    }

    public static Builder builder(DataSource dataSource) {
        return new Builder(dataSource);
    }

    public static final class Builder {
        private final DataSource dataSource;
        private final Map<RouteTemplate, RouteOptions> routes = new java.util.LinkedHashMap<>();
        private IdempotencyClient client = new IdempotencyClient();
        private Tenant tenant = r -> null;
        private TransactionBinding binding = c -> () -> {};
        private Duration connectionTimeout = DEFAULT_CONNECTION_TIMEOUT;

        private Builder(DataSource dataSource) {
            this.dataSource = java.util.Objects.requireNonNull(dataSource, "dataSource");
        }

        /** Protects {@code method} on the path template (literal segments and {@code {name}} segments). */
        public Builder route(String method, String pathTemplate, RouteOptions options) {
            routes.put(RouteTemplate.of(method, pathTemplate), options);
            return this;
        }

        public Builder tenant(Tenant v) {
            tenant = v;
            return this;
        }

        public Builder transactionBinding(TransactionBinding v) {
            binding = v;
            return this;
        }

        public Builder client(IdempotencyClient v) {
            client = v;
            return this;
        }

        /**
         * How long a request waits for a connection of the DataSource (default 1 s), whatever the
         * pool's own timeout: then it is answered 503 service-unavailable with Retry-After.
         */
        public Builder connectionTimeout(Duration v) {
            connectionTimeout = v;
            return this;
        }

        public IdempotencyFilter build() {
            return new IdempotencyFilter(this);
        }
    }

    @Override
    public void destroy() {
        timer.shutdownNow();
        connections.shutdown();
    }

    @Override
    public void doFilter(ServletRequest request, ServletResponse response, FilterChain chain)
            throws IOException, ServletException {
        if (!(request instanceof HttpServletRequest req) || !(response instanceof HttpServletResponse res)) {
            chain.doFilter(request, response);
            return;
        }
        String path = req.getRequestURI().substring(req.getContextPath().length());
        Map.Entry<RouteTemplate, RouteOptions> route = null;
        for (Map.Entry<RouteTemplate, RouteOptions> e : routes.entrySet()) {
            if (e.getKey().matches(req.getMethod(), path)) {
                route = e;
                break;
            }
        }
        if (route == null) {
            chain.doFilter(request, response);
            return;
        }
        try {
            protect(req, res, chain, route.getKey(), route.getValue());
        } catch (HttpProblemException e) {
            send(res, e.answer());
        }
    }

    private void protect(HttpServletRequest req, HttpServletResponse res, FilterChain chain, RouteTemplate route,
            RouteOptions o) throws IOException, ServletException {
        String tenantId = tenant.of(req); // may throw a 401 before anything else
        List<String> keyLines = Collections.list(req.getHeaders(KEY_HEADER));
        String key = null;
        if (!keyLines.isEmpty() || o.required()) {
            try {
                key = IdempotencyKey.parse(keyLines);
            } catch (IdempotencyKey.Refused e) {
                send(res, e.problem().answer());
                return;
            }
        }
        String scope = (tenantId == null ? "" : tenantId + ":") + route.method() + " " + route.template();
        CachedBodyRequest body = new CachedBodyRequest(req, req.getInputStream().readAllBytes());
        String fingerprint = null;
        if (key != null && body.body().length > 0) {
            if (StoredResponse.isJsonType(req.getContentType())) {
                try {
                    fingerprint = Fingerprint.ofJson(body.body(), o.ignore());
                } catch (Json.JsonException e) {
                    send(res, Problem.problem(400, "about:blank", "Invalid request body", "The body is not valid JSON: " + e.getMessage() + "."));
                    return;
                }
            } else {
                fingerprint = Fingerprint.ofBytes(body.body());
            }
        }
        Request r = new Request(body, res, chain, o, scope, key, fingerprint);
        try {
            HttpAnswer answer = o.mode() == Mode.COMMITTED_FIRST ? committedFirst(r) : sameTransaction(r);
            if (answer != null) {
                send(res, answer);
            }
        } catch (SQLException e) {
            send(res, databaseFailure(r, e));
        }
    }

    private record Request(CachedBodyRequest req, HttpServletResponse res, FilterChain chain, RouteOptions o,
            String scope, String key, String fingerprint) {}

    /** What ran: the captured response, or what the handler threw. */
    private record Ran(CapturingResponse response, Throwable thrown) {}

    private Ran run(Request r, IdempotencyContext ctx) {
        r.req().setAttribute(IdempotencyContext.ATTRIBUTE, ctx);
        CapturingResponse captured = new CapturingResponse(r.res());
        try {
            r.chain().doFilter(r.req(), captured);
            return new Ran(captured, null);
        } catch (IOException | ServletException | RuntimeException | Error e) {
            return new Ran(captured, e);
        } finally {
            r.req().removeAttribute(IdempotencyContext.ATTRIBUTE);
        }
    }

    // ---- same transaction ---------------------------------------------------------------

    /**
     * Returns the answer to send, or null when the response was sent. Round trips: pgjdbc sends
     * BEGIN together with the claim (autocommit off: BEGIN is queued in front of the first statement,
     * one Sync for both), idem_complete goes with COMMIT ({@link IdempotencyClient#completeAndCommit}),
     * and an answer without work is sent before its ROLLBACK.
     */
    private HttpAnswer sameTransaction(Request r) throws SQLException, IOException {
        Claimed claimed = openClaim(r);
        Claim c = claimed.claim();
        try (Connection db = claimed.db()) {
            boolean open = true;
            try {
                if (c != null && !c.outcome().owns()) {
                    // The claim wrote nothing: the answer goes out first, the ROLLBACK (below) after it.
                    send(r.res(), answerWithoutWork(c));
                    return null;
                }
                Ran ran;
                Runnable unbind = binding.bind(db);
                try {
                    ran = run(r, new IdempotencyContext(Mode.SAME_TRANSACTION, db, r.scope(), r.key(), c, null));
                } finally {
                    unbind.run();
                }
                if (ran.thrown() != null) {
                    db.rollback();
                    open = false;
                    return thrownAnswer(r, ran.thrown(), "rolled back");
                }
                int status = ran.response().getStatus();
                if (c == null || !r.o().stores(status)) {
                    if (status >= 400) {
                        db.rollback();
                    } else {
                        db.commit();
                    }
                    open = false;
                    sendCaptured(r.res(), ran.response(), ran.response().body());
                    return null;
                }
                StoredResponse.ToStore s = StoredResponse.toStore(ran.response().headerLines(), ran.response().body(),
                        r.o().replayHeaders());
                String stored = client.completeAndCommit(db, r.scope(), r.key(), c.token(), ran.response().getStatus(),
                        s.bodyJson(), s.headersJson());
                open = false;
                byte[] toSend = StoredResponse.bodyToSend(s.headersJson(), stored);
                sendCaptured(r.res(), ran.response(), toSend);
                return null;
            } finally {
                if (open) {
                    rollbackQuietly(db);
                }
                restoreAutoCommit(db);
            }
        }
    }

    /** A connection in an open transaction, and the request's claim in it (null without a key). */
    private record Claimed(Connection db, Claim claim) {}

    /**
     * Same transaction: a connection (within the filter's connection timeout) with autocommit off,
     * and the deferred claim (extension 0.6.0: a claim of a free key writes nothing; idem_complete
     * writes the completed record once). A connection that turns out dead at the claim (the server
     * restarted, or ended the session, while it sat in the pool: its last message, 57P01, or the
     * closed socket) took its transaction with it, so nothing was done: it goes back to the pool,
     * which discards it for that SQLSTATE, and the claim is made on the next connection, until the
     * deadline. So the first requests after a restart succeed, however many pooled connections the
     * restart closed; with the database down they end in 503 at the deadline.
     */
    private Claimed openClaim(Request r) throws SQLException {
        long deadline = connections.deadline();
        Connection db = connections.get(deadline);
        while (true) {
            try {
                db.setAutoCommit(false);
                Claim c = r.key() == null ? null : client.claim(db, r.scope(), r.key(),
                        ClaimOptions.NONE.withFingerprint(r.fingerprint()).withTtl(r.o().ttl()).withDeferred(true));
                return new Claimed(db, c);
            } catch (SQLException e) {
                rollbackQuietly(db);
                restoreAutoCommit(db);
                closeQuietly(db);
                if (!isConnectionFailure(e) || System.nanoTime() - deadline >= 0) {
                    throw e;
                }
                LOG.log(System.Logger.Level.INFO, "pg-idempotency: {0}: the claim''s connection was dead ({1}): taking another",
                        r.scope(), e.getMessage());
                db = connections.get(deadline);
            }
        }
    }

    // ---- committed first ----------------------------------------------------------------

    private HttpAnswer committedFirst(Request r) throws SQLException, IOException {
        if (r.key() == null) {
            Ran ran = run(r, new IdempotencyContext(Mode.COMMITTED_FIRST, null, r.scope(), null, null, null));
            if (ran.thrown() != null) {
                return thrownAnswer(r, ran.thrown(), "not carried out");
            }
            sendCaptured(r.res(), ran.response(), ran.response().body());
            return null;
        }
        Claim c = claimCommitted(r);
        if (!c.outcome().owns()) {
            return answerWithoutWork(c);
        }
        Lease lease = new Lease(client, connections, timer, r.scope(), r.key(), c.token(), r.o().lease(),
                c.recoveryPoint(), c.recoveryDataJson());
        Ran ran;
        try {
            ran = run(r, new IdempotencyContext(Mode.COMMITTED_FIRST, null, r.scope(), r.key(), c, lease));
        } finally {
            lease.stop();
        }
        CapturingResponse captured = ran.response();
        if (ran.thrown() != null) {
            if (isFenced(ran.thrown())) {
                return fenced(r);
            }
            if (!lease.sideEffects) {
                release(r, c.token());
                return thrownAnswer(r, ran.thrown(), "key released");
            }
            HttpAnswer failure = thrownAnswer(r, ran.thrown(), "failure stored");
            return completeAnswer(r, c.token(), failure);
        }
        int status = captured.getStatus();
        if (!r.o().stores(status) && !lease.sideEffects) {
            release(r, c.token());
            sendCaptured(r.res(), captured, captured.body());
            return null;
        }
        byte[] toSend;
        try (Connection db = connections.get()) {
            toSend = complete(db, r, c.token(), captured);
        } catch (IdempotencyException.ClaimTakenOver | IdempotencyException.NoLiveRecord e) {
            return fenced(r);
        }
        sendCaptured(r.res(), captured, toSend);
        return null;
    }

    /**
     * The committed claim, with a fresh caller-chosen token (extension 0.4.0): when the connection
     * breaks during it (or is found dead: a restart closed the pool's connections), the same call
     * repeated on another connection says whether this request owns the key; again until the
     * filter's connection deadline. Without the token a broken claim is not repeated.
     */
    private Claim claimCommitted(Request r) throws SQLException {
        ClaimOptions opts = ClaimOptions.NONE.withFingerprint(r.fingerprint()).withTtl(r.o().ttl())
                .withLease(r.o().lease()).withWaitFor(r.o().waitFor()).withToken(UUID.randomUUID());
        long deadline = connections.deadline();
        while (true) {
            Boolean tokenSupported = null; // unknown until the features are read (nothing claimed before)
            try (Connection db = connections.get(deadline)) {
                tokenSupported = client.features(db).claimToken();
                return client.claim(db, r.scope(), r.key(), opts);
            } catch (SQLException e) {
                if (Boolean.FALSE.equals(tokenSupported) || !isConnectionFailure(e) || System.nanoTime() - deadline >= 0) {
                    throw e;
                }
                LOG.log(System.Logger.Level.INFO, "pg-idempotency: {0} {1}: the claim''s connection failed ({2});"
                        + " repeating it with the same token on another", r.scope(), r.key(), e.getMessage());
            }
        }
    }

    /** Stores a failure after a side effect; returns it as stored (what every replay sends too). */
    private HttpAnswer completeAnswer(Request r, UUID token, HttpAnswer failure) throws SQLException {
        StoredResponse.ToStore s = StoredResponse.toStore(failure.headers(), failure.body(), r.o().replayHeaders());
        String stored;
        try (Connection db = connections.get()) {
            stored = client.complete(db, r.scope(), r.key(), token, failure.status(), s.bodyJson(), s.headersJson());
        } catch (IdempotencyException.ClaimTakenOver | IdempotencyException.NoLiveRecord e) {
            return fenced(r);
        }
        return new HttpAnswer(failure.status(), failure.headers(), StoredResponse.bodyToSend(s.headersJson(), stored));
    }

    private void release(Request r, UUID token) throws SQLException {
        try (Connection db = connections.get()) {
            client.release(db, r.scope(), r.key(), token);
        }
    }

    private HttpAnswer fenced(Request r) {
        LOG.log(System.Logger.Level.WARNING,
                "pg-idempotency: {0} {1}: late completion fenced: another attempt owns the key; not reporting success",
                r.scope(), r.key());
        return Problem.SUPERSEDED.answer();
    }

    // ---- shared ------------------------------------------------------------------------

    /** idem_complete with the captured response; returns the body to send (as stored, byte for byte). */
    private byte[] complete(Connection db, Request r, UUID token, CapturingResponse captured) throws SQLException {
        StoredResponse.ToStore s = StoredResponse.toStore(captured.headerLines(), captured.body(), r.o().replayHeaders());
        String stored = client.complete(db, r.scope(), r.key(), token, captured.getStatus(), s.bodyJson(), s.headersJson());
        return StoredResponse.bodyToSend(s.headersJson(), stored);
    }

    /** The answer to every outcome but claimed / reclaimed. */
    public static HttpAnswer answerWithoutWork(Claim c) {
        if (c.outcome() == Outcome.REPLAY) {
            return StoredResponse.replay(c.responseStatus(), c.responseHeadersJson(), c.responseBodyJson());
        }
        return Problem.forOutcome(c.outcome()).answer(c.retryAfterSeconds());
    }

    private HttpAnswer thrownAnswer(Request r, Throwable t, String what) {
        for (Throwable x = t; x != null; x = x.getCause()) {
            if (x instanceof HttpProblemException p) {
                return p.answer();
            }
        }
        SQLException sql = sqlCause(t);
        if (sql != null && (isConnectionFailure(sql) || isBusy(sql))) {
            return databaseFailure(r, sql);
        }
        LOG.log(System.Logger.Level.ERROR, "pg-idempotency: " + r.scope() + " " + r.key() + ": the handler failed (" + what + ")", t);
        return Problem.INTERNAL_ERROR.answer();
    }

    private HttpAnswer databaseFailure(Request r, SQLException e) {
        if (isConnectionFailure(e)) {
            LOG.log(System.Logger.Level.WARNING, "pg-idempotency: {0}: the database is unreachable: {1}", r.scope(), e.getMessage());
            return Problem.SERVICE_UNAVAILABLE.answer(1);
        }
        if (isBusy(e)) {
            return Problem.IN_PROGRESS.answer(1);
        }
        LOG.log(System.Logger.Level.ERROR, "pg-idempotency: " + r.scope() + " " + r.key() + ": database error", e);
        return Problem.INTERNAL_ERROR.answer();
    }

    private static SQLException sqlCause(Throwable t) {
        for (Throwable x = t; x != null; x = x.getCause()) {
            if (x instanceof SQLException s) {
                return s;
            }
        }
        return null;
    }

    /** Refused, reset, pool timeout, server shutting down: nothing was done, retry later. */
    static boolean isConnectionFailure(SQLException e) {
        String s = e.getSQLState();
        return e instanceof SQLTransientConnectionException || s == null || s.startsWith("08")
                || s.equals("57P01") || s.equals("57P02") || s.equals("57P03");
    }

    /** Waited behind another claim of the key (lock_timeout) or lost a serialization race: 409, retry. */
    private static boolean isBusy(SQLException e) {
        return e instanceof IdempotencyException.LockTimeout || e instanceof IdempotencyException.Serialization;
    }

    private static boolean isFenced(Throwable t) {
        for (Throwable x = t; x != null; x = x.getCause()) {
            if (x instanceof IdempotencyException.ClaimTakenOver || x instanceof IdempotencyException.NoLiveRecord) {
                return true;
            }
        }
        return false;
    }

    private static void closeQuietly(Connection db) {
        try {
            db.close();
        } catch (SQLException e) {
            LOG.log(System.Logger.Level.DEBUG, "close failed", e);
        }
    }

    private static void rollbackQuietly(Connection db) {
        try {
            db.rollback();
        } catch (SQLException e) {
            LOG.log(System.Logger.Level.DEBUG, "rollback failed", e);
        }
    }

    /** Back to autocommit for the pool; on a broken connection the error that broke it is the one to report. */
    private static void restoreAutoCommit(Connection db) {
        try {
            db.setAutoCommit(true);
        } catch (SQLException e) {
            LOG.log(System.Logger.Level.DEBUG, "setAutoCommit(true) failed", e);
        }
    }

    /** Sends the handler's response: its status and headers, with {@code body} (sendError: a problem body). */
    private static void sendCaptured(HttpServletResponse res, CapturingResponse captured, byte[] body) throws IOException {
        if (captured.errorMessage() != null && body.length == 0) {
            int sc = captured.getStatus();
            send(res, Problem.problem(sc, "about:blank", sc >= 500 ? "Internal server error" : "Request refused",
                    captured.errorMessage().isEmpty() ? "The request was refused." : captured.errorMessage()));
            return;
        }
        res.setContentLength(body.length);
        res.getOutputStream().write(body);
        res.flushBuffer();
    }

    /** Sends an answer of the middleware's own, dropping whatever the handler had set. */
    static void send(HttpServletResponse res, HttpAnswer a) throws IOException {
        res.reset();
        res.setStatus(a.status());
        List<Map.Entry<String, String>> headers = new ArrayList<>(a.headers());
        for (Map.Entry<String, String> h : headers) {
            if (h.getKey().equalsIgnoreCase("Content-Type")) {
                res.setContentType(h.getValue());
            } else {
                res.addHeader(h.getKey(), h.getValue());
            }
        }
        res.setContentLength(a.body().length);
        res.getOutputStream().write(a.body());
        res.flushBuffer();
    }
}
