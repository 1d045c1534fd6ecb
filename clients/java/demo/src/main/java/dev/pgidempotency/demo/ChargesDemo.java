package dev.pgidempotency.demo;

import com.zaxxer.hikari.HikariConfig;
import com.zaxxer.hikari.HikariDataSource;
import dev.pgidempotency.DatabaseUrl;
import dev.pgidempotency.http.HttpProblemException;
import dev.pgidempotency.servlet.IdempotencyFilter;
import dev.pgidempotency.servlet.Mode;
import dev.pgidempotency.servlet.RouteOptions;
import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.Statement;
import java.time.Duration;
import org.apache.catalina.Context;
import org.apache.catalina.connector.Connector;
import org.apache.catalina.startup.Tomcat;
import org.apache.tomcat.util.descriptor.web.FilterDef;
import org.apache.tomcat.util.descriptor.web.FilterMap;

/**
 * The demo charges service (the demo-app contract shared by every client package) on embedded
 * Tomcat with {@link IdempotencyFilter}:
 *
 * <pre>java -jar idempotency-demo.jar --database-url postgresql://... --listen 127.0.0.1:8080
 *     [--lease-ms N (default 10000)] [--allow-fault-injection]   (or env DATABASE_URL, LISTEN_ADDR)</pre>
 */
public final class ChargesDemo {
    private static final String USAGE = """
            usage: java -jar idempotency-demo.jar --database-url URL --listen HOST:PORT
                   [--lease-ms N (default 10000)] [--allow-fault-injection]
              (or env DATABASE_URL, LISTEN_ADDR; options win)""";

    private static final String SCHEMA = """
            CREATE TABLE IF NOT EXISTS charges (
                id text PRIMARY KEY, tenant text NOT NULL, amount bigint NOT NULL CHECK (amount > 0),
                currency text NOT NULL, gateway_charge_id text UNIQUE, created_at timestamptz NOT NULL DEFAULT now())""";

    private ChargesDemo() {}

    record Options(String databaseUrl, String host, int port, int leaseMs, boolean faults) {}

    public static void main(String[] args) throws Exception {
        Options o = options(args);
        Tomcat tomcat;
        try {
            tomcat = start(o);
        } catch (Exception e) {
            System.err.println("demo (java): cannot start on " + o.host() + ":" + o.port() + ": " + e);
            System.exit(1);
            return;
        }
        System.err.println("demo (java): listening on http://" + o.host() + ":" + o.port());
        tomcat.getServer().await();
    }

    /** Opens the pool, makes the table and starts Tomcat with the routes and the filter. */
    static Tomcat start(Options o) throws Exception {
        HikariDataSource ds = new HikariDataSource(hikari(o.databaseUrl()));
        try (Connection db = ds.getConnection(); Statement st = db.createStatement()) {
            st.execute(SCHEMA);
        }
        RouteOptions base = RouteOptions.DEFAULTS.withLease(Duration.ofMillis(o.leaseMs()));
        IdempotencyFilter filter = IdempotencyFilter.builder(ds)
                .tenant(ChargesServlet::tenant)
                .route("POST", "/charges", base.withMode(Mode.SAME_TRANSACTION))
                .route("POST", "/charges/external", base.withMode(Mode.COMMITTED_FIRST))
                .build();

        Tomcat tomcat = new Tomcat();
        Path work = Files.createTempDirectory("idempotency-demo-");
        work.toFile().deleteOnExit();
        tomcat.setBaseDir(work.toString());
        Connector connector = new Connector();
        connector.setProperty("address", o.host());
        connector.setPort(o.port());
        connector.setThrowOnFailure(true);
        tomcat.setConnector(connector);
        Context ctx = tomcat.addContext("", null);
        Tomcat.addServlet(ctx, "charges", new ChargesServlet(ds, o.faults())).addMapping("/");
        FilterDef def = new FilterDef();
        def.setFilterName("idempotency");
        def.setFilter(filter);
        ctx.addFilterDef(def);
        FilterMap map = new FilterMap();
        map.setFilterName("idempotency");
        map.addURLPattern("/*");
        ctx.addFilterMap(map);
        tomcat.start();
        return tomcat;
    }

    static Options options(String[] args) {
        String url = System.getenv("DATABASE_URL");
        String listen = System.getenv("LISTEN_ADDR");
        String lease = "10000";
        boolean faults = false;
        for (int i = 0; i < args.length; i++) {
            String a = args[i];
            switch (a) {
                case "--database-url" -> url = value(args, ++i, a);
                case "--listen" -> listen = value(args, ++i, a);
                case "--lease-ms" -> lease = value(args, ++i, a);
                case "--allow-fault-injection" -> faults = true;
                case "--help", "-h" -> {
                    System.err.println(USAGE);
                    System.exit(0);
                }
                default -> fail("unknown option " + a);
            }
        }
        if (url == null) {
            fail("no database: give --database-url or DATABASE_URL");
        }
        if (listen == null) {
            fail("no address: give --listen HOST:PORT or LISTEN_ADDR");
        }
        int colon = listen.lastIndexOf(':');
        int port = -1;
        try {
            port = colon > 0 ? Integer.parseInt(listen.substring(colon + 1)) : -1;
        } catch (NumberFormatException e) {
            port = -1;
        }
        if (port < 0 || port > 65535) {
            fail("--listen: expected HOST:PORT, got " + listen);
        }
        int leaseMs = 0;
        try {
            leaseMs = Integer.parseInt(lease);
        } catch (NumberFormatException e) {
            leaseMs = 0;
        }
        if (leaseMs < 100) {
            fail("--lease-ms: expected an integer >= 100, got " + lease);
        }
        String host = listen.substring(0, colon).replaceAll("^\\[(.*)]$", "$1");
        return new Options(url, host, port, leaseMs, faults);
    }

    private static String value(String[] args, int i, String option) {
        if (i >= args.length) {
            fail(option + " needs a value");
        }
        return args[i];
    }

    private static void fail(String message) {
        System.err.println("demo: " + message + "\n" + USAGE);
        System.exit(2);
    }

    static HikariConfig hikari(String databaseUrl) {
        HikariConfig c = new HikariConfig();
        try {
            c.setJdbcUrl(DatabaseUrl.toJdbc(databaseUrl));
        } catch (IllegalArgumentException e) {
            fail("--database-url: " + e.getMessage());
        }
        c.setMaximumPoolSize(24);
        c.setConnectionTimeout(5000);
        c.setInitializationFailTimeout(-1); // start even while the database is down: requests get 503
        c.setPoolName("demo");
        return c;
    }

    /** The 401 every route gives without X-Api-Key, before anything is claimed. */
    static HttpProblemException unauthorized() {
        return new HttpProblemException(401, "Unauthorized", "Give your API key in the X-Api-Key header.")
                .withHeader("WWW-Authenticate", "ApiKey realm=\"charges\"");
    }
}
