package example;

import com.zaxxer.hikari.HikariConfig;
import com.zaxxer.hikari.HikariDataSource;
import dev.pgidempotency.DatabaseUrl;
import dev.pgidempotency.Json;
import dev.pgidempotency.http.HttpProblemException;
import dev.pgidempotency.servlet.IdempotencyContext;
import dev.pgidempotency.servlet.IdempotencyFilter;
import dev.pgidempotency.servlet.RouteOptions;
import jakarta.servlet.http.HttpServlet;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.IOException;
import java.math.BigDecimal;
import java.nio.file.Files;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.Map;
import org.apache.catalina.Context;
import org.apache.catalina.startup.Tomcat;
import org.apache.tomcat.util.descriptor.web.FilterDef;
import org.apache.tomcat.util.descriptor.web.FilterMap;

/**
 * The README's Servlet example, no framework: POST /orders on embedded Tomcat made idempotent by
 * IdempotencyFilter, the row written on the claim's connection, in its transaction.
 *
 * <pre>
 * DATABASE_URL=postgresql://app@localhost/app PORT=8080 java -cp ... example.OrdersServer
 * </pre>
 *
 * The database needs {@code CREATE EXTENSION idempotency}; the app creates its table.
 */
public final class OrdersServer {
    public static void main(String[] args) throws Exception {
        HikariConfig pool = new HikariConfig();
        pool.setJdbcUrl(DatabaseUrl.toJdbc(System.getenv("DATABASE_URL"))); // jdbc:postgresql://...&prepareThreshold=0
        HikariDataSource db = new HikariDataSource(pool);
        try (Connection c = db.getConnection()) {
            c.createStatement().execute("CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY,"
                    + " tenant text NOT NULL, item text NOT NULL, quantity int NOT NULL)");
        }
        IdempotencyFilter idempotency = IdempotencyFilter.builder(db)
                .tenant(OrdersServer::tenantOf)
                .route("POST", "/orders", RouteOptions.DEFAULTS) // same transaction
                .build();

        Tomcat tomcat = new Tomcat();
        tomcat.setBaseDir(Files.createTempDirectory("orders-server").toString());
        tomcat.setPort(Integer.parseInt(System.getenv().getOrDefault("PORT", "8080")));
        tomcat.getConnector().setProperty("address", "127.0.0.1");
        Context app = tomcat.addContext("", null);
        Tomcat.addServlet(app, "orders", new Orders()).addMapping("/orders");
        FilterDef filter = new FilterDef();
        filter.setFilterName("idempotency");
        filter.setFilter(idempotency);
        app.addFilterDef(filter);
        FilterMap everything = new FilterMap();
        everything.setFilterName("idempotency");
        everything.addURLPattern("/*");
        app.addFilterMap(everything);
        tomcat.start();
        tomcat.getServer().await();
    }

    /** Whose keys these are (one caller's key never answers another's): the API key here. */
    static String tenantOf(HttpServletRequest request) {
        String apiKey = request.getHeader("X-Api-Key");
        if (apiKey == null || apiKey.isEmpty()) {
            throw new HttpProblemException(401, "Unauthorized", "Send your API key in X-Api-Key.");
        }
        return apiKey;
    }

    static final class Orders extends HttpServlet {
        private static final long serialVersionUID = 1L;

        @Override
        protected void doPost(HttpServletRequest req, HttpServletResponse res) throws IOException {
            Object body = Json.parse(req.getInputStream().readAllBytes()); // the filter checked it is JSON
            if (!(body instanceof Map<?, ?> in && in.get("item") instanceof String item
                    && in.get("quantity") instanceof BigDecimal q && q.signum() > 0 && q.scale() <= 0)) {
                throw new HttpProblemException(422, "Invalid order", "Give an item and a positive quantity.");
            }
            IdempotencyContext idem = IdempotencyContext.of(req); // the claim's transaction
            try (PreparedStatement st = idem.connection().prepareStatement(
                    "INSERT INTO orders (tenant, item, quantity) VALUES (?, ?, ?) RETURNING id")) {
                st.setString(1, tenantOf(req));
                st.setString(2, item);
                st.setInt(3, q.intValueExact());
                try (ResultSet rs = st.executeQuery()) {
                    rs.next();
                    res.setStatus(201);
                    res.setHeader("Location", "/orders/" + rs.getLong(1));
                    res.setContentType("application/json");
                    res.getWriter().write(Json.write(Map.of("id", rs.getLong(1), "item", item, "quantity", q)));
                }
            } catch (SQLException e) {
                throw new IOException(e); // rolled back; 503 when the database went away, else 500
            }
        }
    }
}
