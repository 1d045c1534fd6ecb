package dev.pgidempotency.servlet;

import dev.pgidempotency.Json;
import dev.pgidempotency.http.HttpProblemException;
import jakarta.servlet.Filter;
import jakarta.servlet.http.HttpServlet;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.Map;
import javax.sql.DataSource;
import org.apache.catalina.Context;
import org.apache.catalina.connector.Connector;
import org.apache.catalina.startup.Tomcat;
import org.apache.tomcat.util.descriptor.web.FilterDef;
import org.apache.tomcat.util.descriptor.web.FilterMap;

/**
 * The tests' application: embedded Tomcat, the filter under test, and one servlet whose behaviour
 * the request's X-Test-* headers choose. Writes go to the table items (tenant, note).
 */
final class TestApp implements AutoCloseable {
    private final Tomcat tomcat = new Tomcat();
    final int port;

    TestApp(Filter filter, DataSource ds, int port) throws Exception {
        tomcat.setBaseDir(Files.createTempDirectory("idem-servlet-test").toString());
        Connector connector = new Connector();
        connector.setProperty("address", "127.0.0.1");
        connector.setPort(port);
        connector.setThrowOnFailure(true);
        tomcat.setConnector(connector);
        Context ctx = tomcat.addContext("", null);
        Tomcat.addServlet(ctx, "app", new AppServlet(ds)).addMapping("/");
        FilterDef def = new FilterDef();
        def.setFilterName("idempotency");
        def.setFilter(filter);
        ctx.addFilterDef(def);
        FilterMap map = new FilterMap();
        map.setFilterName("idempotency");
        map.addURLPattern("/*");
        ctx.addFilterMap(map);
        tomcat.start();
        this.port = connector.getLocalPort();
    }

    @Override
    public void close() throws org.apache.catalina.LifecycleException {
        tomcat.stop();
        tomcat.destroy();
    }

    static void createTable(DataSource ds) throws SQLException {
        try (Connection c = ds.getConnection()) {
            c.createStatement().execute("CREATE TABLE IF NOT EXISTS items (id bigserial PRIMARY KEY, tenant text NOT NULL, note text)");
        }
    }

    static long count(DataSource ds, String tenant) throws SQLException {
        try (Connection c = ds.getConnection(); PreparedStatement st = c.prepareStatement("SELECT count(*) FROM items WHERE tenant = ?")) {
            st.setString(1, tenant);
            try (ResultSet rs = st.executeQuery()) {
                rs.next();
                return rs.getLong(1);
            }
        }
    }

    private static final class AppServlet extends HttpServlet {
        private static final long serialVersionUID = 1L;
        private final transient DataSource ds;

        AppServlet(DataSource ds) {
            this.ds = ds;
        }

        @Override
        protected void service(HttpServletRequest req, HttpServletResponse res) throws IOException {
            try {
                handle(req, res);
            } catch (SQLException e) {
                throw new IllegalStateException(e);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new IllegalStateException(e);
            }
        }

        private void handle(HttpServletRequest req, HttpServletResponse res) throws IOException, SQLException, InterruptedException {
            IdempotencyContext ctx = IdempotencyContext.of(req);
            String tenant = req.getHeader("X-Api-Key") == null ? "anon" : req.getHeader("X-Api-Key");
            req.getInputStream().readAllBytes(); // the handler can read the body the filter read
            long sleep = req.getHeader("X-Test-Sleep-Ms") == null ? 0 : Long.parseLong(req.getHeader("X-Test-Sleep-Ms"));
            Thread.sleep(sleep);
            long id;
            if (ctx != null && ctx.mode() == Mode.SAME_TRANSACTION) {
                id = insert(ctx.connection(), tenant);
            } else {
                try (Connection c = ds.getConnection()) {
                    id = insert(c, tenant);
                }
                if ("1".equals(req.getHeader("X-Test-Checkpoint")) && ctx != null && ctx.key() != null) {
                    ctx.checkpoint("inserted", Json.write(Map.of("id", id)));
                }
            }
            if ("1".equals(req.getHeader("X-Test-Wait-Lost"))) {
                for (int i = 0; i < 200 && !ctx.lost(); i++) {
                    Thread.sleep(50);
                }
            }
            String fail = req.getHeader("X-Test-Throw");
            if ("problem".equals(fail)) {
                throw new HttpProblemException(400, "Invalid request", "The handler refused it.");
            }
            if ("error".equals(fail)) {
                throw new IllegalStateException("the handler failed");
            }
            if (req.getHeader("X-Test-Send-Error") != null) {
                res.sendError(Integer.parseInt(req.getHeader("X-Test-Send-Error")), "refused by sendError");
                return;
            }
            int status = req.getHeader("X-Test-Status") == null ? 201 : Integer.parseInt(req.getHeader("X-Test-Status"));
            res.setStatus(status);
            res.setHeader("Location", "/items/" + id);
            res.setHeader("X-Not-Stored", "1");
            String kind = req.getHeader("X-Test-Body") == null ? "json" : req.getHeader("X-Test-Body");
            switch (kind) {
                case "text" -> {
                    res.setContentType("text/plain; charset=utf-8");
                    res.getWriter().write("item " + id + " caf\u00e9\n");
                }
                case "binary" -> {
                    res.setContentType("application/octet-stream");
                    res.getOutputStream().write(new byte[] {0, (byte) 0xff, (byte) id, (byte) 0xc3});
                }
                default -> {
                    res.setContentType("application/json");
                    res.getOutputStream().write(("{\"id\":" + id + ",  \"tenant\":" + Json.quote(tenant) + "}").getBytes(StandardCharsets.UTF_8));
                }
            }
        }

        private static long insert(Connection c, String tenant) throws SQLException {
            try (PreparedStatement st = c.prepareStatement("INSERT INTO items (tenant) VALUES (?) RETURNING id")) {
                st.setString(1, tenant);
                try (ResultSet rs = st.executeQuery()) {
                    rs.next();
                    return rs.getLong(1);
                }
            }
        }
    }
}
