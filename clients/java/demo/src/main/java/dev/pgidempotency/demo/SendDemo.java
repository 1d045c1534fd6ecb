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
import java.util.logging.Handler;
import java.util.logging.LogRecord;
import java.util.logging.Logger;

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
 * SEND_TIMEOUT_MS (10000), RECEIVER_API_KEY (sent as X-Api-Key; send-demo), and the sender's own
 * settings when set: SEND_RETRY_BUDGET, SEND_BACKOFF_BASE_MS, SEND_BACKOFF_CAP_MS,
 * SEND_GIVE_UP_AFTER_MS.
 *
 * <p>A sender the package refuses (SEND_TIMEOUT_MS &gt;= SEND_LEASE_MS, a bad setting) prints
 * {@code refused MESSAGE} and exits 2. The worker prints {@code db-error SQLSTATE_OR_CLASS MESSAGE}
 * for each database error its loop meets and {@code db-reconnected} when it works again (from the
 * package's logger, dev.pgidempotency.Sender, through java.util.logging). SIGTERM: the attempts in
 * flight are recorded, then exit 0.
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

    static void prepareOrders(HikariDataSource ds, Sender sender, String target, int count, String prefix,
            AfterCommit after) throws SQLException {
        try (Connection c = ds.getConnection()) {
            try (Statement st = c.createStatement()) {
                st.execute(SCHEMA);
            }
            for (int i = 1; i <= count; i++) {
                String order = prefix + "-" + i;
                String operation = order + ":charge";
                c.setAutoCommit(false);
                try {
                    Sender.Prepared sent = sender.prepare(c, SCOPE, operation, target,
                            "{\"amount\": " + i + ", \"currency\": \"eur\"}");
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

    private static Duration envMillis(String name) {
        String v = System.getenv(name);
        return v == null || v.isEmpty() ? null : Duration.ofMillis(Long.parseLong(v));
    }

    /** The sender of the protocol's environment; IllegalArgumentException when the package refuses it. */
    private static Sender sender(HikariDataSource ds, String target, int concurrency) {
        String budget = System.getenv("SEND_RETRY_BUDGET");
        return Sender.builder(ds)
                .url(target, System.getenv("RECEIVER_URL"))
                .header(target, "X-Api-Key", env("RECEIVER_API_KEY", "send-demo"))
                .lease(Duration.ofMillis(Long.parseLong(env("SEND_LEASE_MS", "30000"))))
                .timeout(Duration.ofMillis(Long.parseLong(env("SEND_TIMEOUT_MS", "10000"))))
                .retryBudget(budget == null || budget.isEmpty() ? null : Double.valueOf(budget))
                .backoff(envMillis("SEND_BACKOFF_BASE_MS"), envMillis("SEND_BACKOFF_CAP_MS"))
                .giveUpAfter(envMillis("SEND_GIVE_UP_AFTER_MS"))
                .concurrency(concurrency)
                .pollInterval(Duration.ofMillis(200))
                .onAttempt((a, answer) -> say("attempt " + a.operation() + " " + a.attempt() + " "
                        + (answer.status() == null ? "none" : answer.status())))
                .onFinished((a, r) -> say("finished " + a.operation() + " " + describe(r)))
                .build();
    }

    /** The sender's log records (java.util.logging, where System.Logger goes by default), as the protocol's lines. */
    static final class DbEvents extends Handler {
        @Override
        public void publish(LogRecord r) {
            if (r.getThrown() instanceof SQLException e) {
                say("db-error " + Sender.errorCode(e) + " " + Sender.firstLine(e));
            } else if (Sender.RECONNECTED.equals(r.getMessage())) {
                say("db-reconnected");
            }
        }

        @Override
        public void flush() {}

        @Override
        public void close() {}
    }

    /** Held: java.util.logging keeps loggers weakly, and with them their handlers. */
    private static final Logger SENDER_LOG = Logger.getLogger(Sender.LOGGER);

    public static void main(String[] args) throws Exception {
        if (args.length == 0) {
            System.err.println("usage: SendDemo prepare COUNT PREFIX | work [--until-idle] [--concurrency N] | inline COUNT PREFIX");
            System.exit(2);
        }
        HikariConfig hc = new HikariConfig();
        hc.setJdbcUrl(DatabaseUrl.toJdbc(System.getenv("DATABASE_URL")));
        hc.setMaximumPoolSize(8);
        hc.setPoolName("send-demo");
        hc.setConnectionTimeout(5000); // while the database is down, the worker says so every 5 s at least
        String target = env("TARGET", "receiver");
        List<String> rest = List.of(args).subList(1, args.length);
        int i = rest.indexOf("--concurrency");
        int concurrency = i >= 0 ? Integer.parseInt(rest.get(i + 1)) : 4;
        try (HikariDataSource ds = new HikariDataSource(hc)) {
            Sender sender;
            try {
                sender = sender(ds, target, concurrency);
            } catch (IllegalArgumentException e) {
                say("refused " + e.getMessage());
                System.exit(2);
                return;
            }
            try (sender) {
                switch (args[0]) {
                    case "prepare" -> {
                        prepareOrders(ds, sender, target, Integer.parseInt(rest.get(0)), rest.get(1), null);
                        say("prepared " + rest.get(0));
                    }
                    case "inline" -> prepareOrders(ds, sender, target, Integer.parseInt(rest.get(0)), rest.get(1),
                            op -> say("delivered " + op + " " + describe(sender.deliver(SCOPE, op))));
                    case "work" -> {
                        SENDER_LOG.addHandler(new DbEvents());
                        work(sender, target, rest.contains("--until-idle"));
                    }
                    default -> {
                        System.err.println("unknown command " + args[0]);
                        System.exit(2);
                    }
                }
            }
        }
        System.out.flush();
    }

    /** The worker; SIGTERM while it runs: the attempts in flight are recorded, then exit 0. */
    private static void work(Sender sender, String target, boolean untilIdle) {
        AtomicBoolean stop = new AtomicBoolean();
        AtomicBoolean running = new AtomicBoolean(true);
        CountDownLatch finished = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            if (!running.get()) {
                return; // the worker ended by itself: the JVM exits with its own status
            }
            stop.set(true);
            try {
                finished.await();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            System.out.flush();
            Runtime.getRuntime().halt(0);
        }));
        try {
            sender.run(target, untilIdle, stop::get);
        } finally {
            running.set(false);
            finished.countDown();
        }
    }

    private static synchronized void say(String line) {
        System.out.println(line);
        System.out.flush();
    }
}
