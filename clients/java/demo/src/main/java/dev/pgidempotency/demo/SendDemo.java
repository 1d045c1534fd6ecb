package dev.pgidempotency.demo;

import com.zaxxer.hikari.HikariConfig;
import com.zaxxer.hikari.HikariDataSource;
import dev.pgidempotency.DatabaseUrl;
import dev.pgidempotency.SendResult;
import dev.pgidempotency.Sender;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.sql.Statement;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * The sender demo (tests/sending/README.md's protocol): orders whose charge is sent to a receiver
 * with an Idempotency-Key made once, in the order's transaction.
 *
 * <pre>
 * java -cp clients/java/demo/target/idempotency-demo.jar dev.pgidempotency.demo.SendDemo \
 *     prepare COUNT PREFIX | work [--until-idle] [--concurrency N] | inline COUNT PREFIX
 * </pre>
 *
 * Environment: DATABASE_URL, RECEIVER_URL, TARGET (receiver), SEND_LEASE_MS (30000),
 * SEND_TIMEOUT_MS (10000), RECEIVER_API_KEY (sent as X-Api-Key; send-demo).
 */
public final class SendDemo {
    private static final String SCOPE = "send-demo";
    private static final String SCHEMA = """
            CREATE TABLE IF NOT EXISTS send_demo_orders (id text PRIMARY KEY, amount int NOT NULL,
                payment_key text NOT NULL)""";

    private SendDemo() {}

    static String describe(SendResult r) {
        if (r instanceof SendResult.Delivered d) {
            return "done " + d.status();
        } else if (r instanceof SendResult.Unknown) {
            return "gave_up unknown";
        } else if (r instanceof SendResult.NotYet n) {
            return n.state() + " unknown";
        }
        return "lost unknown";
    }

    private static String env(String name, String fallback) {
        String v = System.getenv(name);
        return v == null || v.isEmpty() ? fallback : v;
    }

    interface AfterCommit {
        void run(String operation) throws SQLException;
    }

    static void prepareOrders(HikariDataSource ds, String target, int count, String prefix, AfterCommit after)
            throws SQLException {
        try (Connection c = ds.getConnection()) {
            try (Statement st = c.createStatement()) {
                st.execute(SCHEMA);
            }
            for (int i = 1; i <= count; i++) {
                String order = prefix + "-" + i;
                String operation = order + ":charge";
                c.setAutoCommit(false);
                try {
                    Sender.Prepared sent = Sender.prepare(c, SCOPE, operation, target,
                            "{\"amount\": " + i + ", \"currency\": \"eur\"}", null, null);
                    try (PreparedStatement st = c.prepareStatement(
                            "INSERT INTO send_demo_orders VALUES (?, ?, ?) ON CONFLICT (id) DO NOTHING")) {
                        st.setString(1, order);
                        st.setInt(2, i);
                        st.setString(3, sent.key());
                        st.executeUpdate();
                    }
                    c.commit();
                } catch (SQLException e) {
                    c.rollback();
                    throw e;
                } finally {
                    c.setAutoCommit(true);
                }
                if (after != null) {
                    after.run(operation);
                }
            }
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length == 0) {
            System.err.println("usage: SendDemo prepare COUNT PREFIX | work [--until-idle] [--concurrency N] | inline COUNT PREFIX");
            System.exit(2);
        }
        HikariConfig hc = new HikariConfig();
        hc.setJdbcUrl(DatabaseUrl.toJdbc(System.getenv("DATABASE_URL")));
        hc.setMaximumPoolSize(8);
        hc.setPoolName("send-demo");
        String target = env("TARGET", "receiver");
        List<String> rest = List.of(args).subList(1, args.length);
        try (HikariDataSource ds = new HikariDataSource(hc)) {
            switch (args[0]) {
                case "prepare" -> {
                    prepareOrders(ds, target, Integer.parseInt(rest.get(0)), rest.get(1), null);
                    System.out.println("prepared " + rest.get(0));
                }
                case "work", "inline" -> {
                    int i = rest.indexOf("--concurrency");
                    int concurrency = i >= 0 ? Integer.parseInt(rest.get(i + 1)) : 4;
                    try (Sender sender = Sender.builder(ds)
                            .url(target, System.getenv("RECEIVER_URL"))
                            .header(target, "X-Api-Key", env("RECEIVER_API_KEY", "send-demo"))
                            .lease(Duration.ofMillis(Long.parseLong(env("SEND_LEASE_MS", "30000"))))
                            .timeout(Duration.ofMillis(Long.parseLong(env("SEND_TIMEOUT_MS", "10000"))))
                            .concurrency(concurrency)
                            .pollInterval(Duration.ofMillis(200))
                            .onAttempt((a, answer) -> say("attempt " + a.operation() + " " + a.attempt() + " "
                                    + (answer.status() == null ? "none" : answer.status())))
                            .onFinished((a, r) -> say("finished " + a.operation() + " " + describe(r)))
                            .build()) {
                        if (args[0].equals("inline")) {
                            prepareOrders(ds, target, Integer.parseInt(rest.get(0)), rest.get(1),
                                    op -> say("delivered " + op + " " + describe(sender.deliver(SCOPE, op))));
                        } else {
                            work(sender, target, rest.contains("--until-idle"));
                        }
                    }
                }
                default -> {
                    System.err.println("unknown command " + args[0]);
                    System.exit(2);
                }
            }
        }
        System.out.flush();
    }

    /** The worker; SIGTERM: the attempts in flight are recorded, then the JVM exits (status 143, the JVM's). */
    private static void work(Sender sender, String target, boolean untilIdle) throws SQLException {
        AtomicBoolean stop = new AtomicBoolean();
        CountDownLatch finished = new CountDownLatch(1);
        Thread hook = new Thread(() -> {
            stop.set(true);
            try {
                finished.await();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        });
        Runtime.getRuntime().addShutdownHook(hook);
        try {
            sender.run(target, untilIdle, stop::get);
        } finally {
            finished.countDown();
        }
    }

    private static synchronized void say(String line) {
        System.out.println(line);
        System.out.flush();
    }
}
