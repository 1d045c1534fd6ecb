package dev.pgidempotency.servlet;

import java.sql.Connection;
import java.sql.SQLException;
import java.sql.SQLTransientConnectionException;
import java.time.Duration;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import javax.sql.DataSource;

/**
 * The filter's connections: the application's DataSource waited for until a deadline, whatever
 * the pool's own timeout (HikariCP's connectionTimeout is 30 s by default), so that a request
 * answers 503 within the filter's bound while the database is down. JDBC has no per-call timeout,
 * so the DataSource is asked on a thread of this class: a request that stops waiting leaves the
 * connection, should it come later, to be given back at once. At most {@link #BORROWERS} threads
 * wait in the pool at a time; the requests beyond them wait in line, within the same deadline.
 */
final class BoundedConnections {
    static final int BORROWERS = 16;

    private final DataSource dataSource;
    private final Duration bound;
    private final ThreadPoolExecutor borrowers;

    BoundedConnections(DataSource dataSource, Duration bound) {
        if (bound == null || bound.isNegative() || bound.isZero()) {
            throw new IllegalArgumentException("the connection timeout must be positive (got " + bound + ")");
        }
        this.dataSource = dataSource;
        this.bound = bound;
        this.borrowers = new ThreadPoolExecutor(BORROWERS, BORROWERS, 30, TimeUnit.SECONDS, new LinkedBlockingQueue<>(), r -> {
            Thread t = new Thread(r, "pg-idempotency-connections");
            t.setDaemon(true);
            return t;
        });
        this.borrowers.allowCoreThreadTimeOut(true);
    }

    /** A deadline {@code bound} from now (System.nanoTime()). */
    long deadline() {
        return System.nanoTime() + bound.toNanos();
    }

    /** A connection within the bound. */
    Connection get() throws SQLException {
        return get(deadline());
    }

    /** A connection by {@code deadline}; SQLTransientConnectionException (the filter's 503) when none came. */
    Connection get(long deadline) throws SQLException {
        Borrow b = new Borrow(dataSource);
        try {
            borrowers.execute(b);
        } catch (RejectedExecutionException e) {
            throw new SQLTransientConnectionException("the filter is shut down", e);
        }
        return b.await(deadline, bound);
    }

    void shutdown() {
        borrowers.shutdownNow();
    }

    /** One getConnection() on a borrower thread, handed to the request unless it gave up waiting. */
    private static final class Borrow implements Runnable {
        private final DataSource dataSource;
        private Connection connection;
        private SQLException error;
        private boolean done;
        private boolean abandoned;

        Borrow(DataSource dataSource) {
            this.dataSource = dataSource;
        }

        @Override
        public void run() {
            synchronized (this) {
                if (abandoned) {
                    return;
                }
            }
            Connection c = null;
            SQLException e = null;
            try {
                c = dataSource.getConnection();
            } catch (SQLException x) {
                e = x;
            } catch (RuntimeException x) {
                e = new SQLException("getConnection failed: " + x, x);
            }
            boolean giveBack;
            synchronized (this) {
                giveBack = abandoned;
                if (!abandoned) {
                    connection = c;
                    error = e;
                    done = true;
                    notifyAll();
                }
            }
            if (giveBack && c != null) {
                try {
                    c.close();
                } catch (SQLException x) {
                    // a connection nobody waits for any more
                }
            }
        }

        synchronized Connection await(long deadline, Duration bound) throws SQLException {
            while (!done) {
                long left = deadline - System.nanoTime();
                if (left <= 0) {
                    abandoned = true;
                    throw new SQLTransientConnectionException("no database connection within " + bound.toMillis()
                            + " ms (the filter's connection timeout)", "08001");
                }
                try {
                    TimeUnit.NANOSECONDS.timedWait(this, left);
                } catch (InterruptedException x) {
                    abandoned = true;
                    Thread.currentThread().interrupt();
                    throw new SQLTransientConnectionException("interrupted while waiting for a database connection", "08001", x);
                }
            }
            if (error != null) {
                throw error;
            }
            return connection;
        }
    }
}
