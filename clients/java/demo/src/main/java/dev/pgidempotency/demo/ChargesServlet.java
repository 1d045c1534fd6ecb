package dev.pgidempotency.demo;

import dev.pgidempotency.Json;
import dev.pgidempotency.http.HttpAnswer;
import dev.pgidempotency.http.HttpProblemException;
import dev.pgidempotency.http.Problem;
import dev.pgidempotency.servlet.IdempotencyContext;
import jakarta.servlet.http.HttpServlet;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.IOException;
import java.math.BigDecimal;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.Map;
import javax.sql.DataSource;

/** The demo's routes: POST /charges (same transaction), POST /charges/external (committed first), GET /charges/{id}, GET /healthz. */
final class ChargesServlet extends HttpServlet {
    private static final long serialVersionUID = 1L;
    private static final BigDecimal MAX_SAFE_INTEGER = BigDecimal.valueOf(9007199254740991L);

    private static final String CHARGE_JSON = """
            jsonb_build_object('id', id, 'object', 'charge', 'amount', amount, 'currency', currency,
              'gateway_charge_id', gateway_charge_id, 'status', 'succeeded', 'created_at', created_at)::text""";
    private static final String INSERT_CHARGE = """
            INSERT INTO charges (id, tenant, amount, currency)
            VALUES ('ch_' || replace(gen_random_uuid()::text, '-', ''), ?, ?, ?)
            RETURNING id,""" + " " + CHARGE_JSON;
    private static final String SELECT_CHARGE = "SELECT " + CHARGE_JSON + " FROM charges WHERE id = ? AND tenant = ?";

    private final transient DataSource ds;
    private final boolean faults;

    ChargesServlet(DataSource ds, boolean faults) {
        this.ds = ds;
        this.faults = faults;
    }

    /** The tenant is the X-Api-Key header; missing or empty: 401. */
    static String tenant(HttpServletRequest req) {
        String v = req.getHeader("X-Api-Key");
        if (v == null || v.isEmpty()) {
            throw ChargesDemo.unauthorized();
        }
        return v;
    }

    @Override
    protected void service(HttpServletRequest req, HttpServletResponse res) throws IOException {
        String path = req.getRequestURI();
        try {
            if (req.getMethod().equals("GET") && path.equals("/healthz")) {
                send(res, 200, "text/plain; charset=utf-8", "ok\n");
            } else if (req.getMethod().equals("POST") && path.equals("/charges")) {
                charge(req, res);
            } else if (req.getMethod().equals("POST") && path.equals("/charges/external")) {
                chargeExternal(req, res);
            } else if (req.getMethod().equals("GET") && path.startsWith("/charges/") && path.indexOf('/', 9) < 0) {
                get(req, res, path.substring("/charges/".length()));
            } else {
                answer(res, Problem.problem(404, "about:blank", "Not found", "No such route."));
            }
        } catch (HttpProblemException e) {
            answer(res, e.answer());
        } catch (SQLException e) {
            throw new IllegalStateException("database error: " + e.getMessage(), e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException("interrupted", e);
        }
    }

    /** POST /charges: the charge row and the stored response commit with the claim. */
    private void charge(HttpServletRequest req, HttpServletResponse res) throws IOException, SQLException {
        Map<String, Object> body = chargeRequest(req);
        IdempotencyContext ctx = IdempotencyContext.of(req);
        created(res, insert(ctx.connection(), tenant(req), body));
    }

    /**
     * POST /charges/external: the claim commits first; the charge row is written later in a
     * transaction of its own, fenced by a checkpoint that records its id.
     */
    private void chargeExternal(HttpServletRequest req, HttpServletResponse res)
            throws IOException, SQLException, InterruptedException {
        Map<String, Object> body = chargeRequest(req);
        String tenant = tenant(req);
        IdempotencyContext ctx = IdempotencyContext.of(req);
        if ("charged".equals(ctx.recoveryPoint())) {
            // An earlier attempt wrote the charge and died before completing: answer with it.
            String id = (String) ((Map<?, ?>) Json.parse(ctx.recoveryDataJson())).get("id");
            try (Connection db = ds.getConnection()) {
                created(res, select(db, id, tenant));
            }
            return;
        }
        if (faults) {
            String delay = req.getHeader("X-Fault-Delay-Ms");
            if (delay != null && Long.parseLong(delay) > 0) {
                Thread.sleep(Long.parseLong(delay));
            }
            if ("1".equals(req.getHeader("X-Fault-Fail-Before"))) {
                throw new IllegalStateException("fault injected before the side effect");
            }
        }
        try (Connection db = ds.getConnection()) {
            db.setAutoCommit(false);
            try {
                String[] charge = insert(db, tenant, body);
                ctx.checkpoint(db, "charged", Json.write(Map.of("id", charge[0])));
                db.commit();
                created(res, charge);
            } finally {
                db.rollback();
                db.setAutoCommit(true);
            }
        }
    }

    private void get(HttpServletRequest req, HttpServletResponse res, String id) throws IOException, SQLException {
        String tenant = tenant(req);
        try (Connection db = ds.getConnection()) {
            String[] charge = select(db, id, tenant);
            if (charge == null) {
                answer(res, Problem.problem(404, "about:blank", "Not found", "No such charge."));
            } else {
                send(res, 200, "application/json", charge[1]);
            }
        }
    }

    @SuppressWarnings("unchecked")
    private static Map<String, Object> chargeRequest(HttpServletRequest req) throws IOException {
        Object body;
        try {
            body = Json.parse(req.getInputStream().readAllBytes());
        } catch (Json.JsonException e) {
            body = null;
        }
        boolean ok = body instanceof Map<?, ?> m && m.size() == 2
                && m.get("amount") instanceof BigDecimal a && isPositiveInteger(a)
                && m.get("currency") instanceof String c && !c.isEmpty();
        if (!ok) {
            throw new HttpProblemException(400, "Invalid request",
                    "The body must be {\"amount\": <integer > 0>, \"currency\": <string>}.");
        }
        return (Map<String, Object>) body;
    }

    private static boolean isPositiveInteger(BigDecimal a) {
        return a.signum() > 0 && a.stripTrailingZeros().scale() <= 0 && a.compareTo(MAX_SAFE_INTEGER) <= 0;
    }

    /** {id, charge JSON} */
    private static String[] insert(Connection db, String tenant, Map<String, Object> body) throws SQLException {
        try (PreparedStatement st = db.prepareStatement(INSERT_CHARGE)) {
            st.setString(1, tenant);
            st.setLong(2, ((BigDecimal) body.get("amount")).longValueExact());
            st.setString(3, (String) body.get("currency"));
            try (ResultSet rs = st.executeQuery()) {
                rs.next();
                return new String[] {rs.getString(1), rs.getString(2)};
            }
        }
    }

    private static String[] select(Connection db, String id, String tenant) throws SQLException {
        try (PreparedStatement st = db.prepareStatement(SELECT_CHARGE)) {
            st.setString(1, id);
            st.setString(2, tenant);
            try (ResultSet rs = st.executeQuery()) {
                return rs.next() ? new String[] {id, rs.getString(1)} : null;
            }
        }
    }

    private static void created(HttpServletResponse res, String[] charge) throws IOException {
        res.setStatus(201);
        res.setHeader("Location", "/charges/" + charge[0]);
        send(res, 201, "application/json", charge[1]);
    }

    private static void send(HttpServletResponse res, int status, String contentType, String body) throws IOException {
        byte[] bytes = body.getBytes(StandardCharsets.UTF_8);
        res.setStatus(status);
        res.setContentType(contentType);
        res.setContentLength(bytes.length);
        res.getOutputStream().write(bytes);
    }

    private static void answer(HttpServletResponse res, HttpAnswer a) throws IOException {
        res.setStatus(a.status());
        for (Map.Entry<String, String> h : a.headers()) {
            if (h.getKey().equalsIgnoreCase("Content-Type")) {
                res.setContentType(h.getValue());
            } else {
                res.addHeader(h.getKey(), h.getValue());
            }
        }
        res.setContentLength(a.body().length);
        res.getOutputStream().write(a.body());
    }
}
