package dev.pgidempotency;

import java.sql.SQLException;
import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.function.DoubleSupplier;

/** The sender's pure rules: its settings checked and written as the extension reads them, and its waits. */
final class SendRules {
    /** The extension's limits of its settings (docs/reference.md): a budget of at most 1,000,000, */
    static final double MAX_RETRY_BUDGET = 1_000_000;
    /** intervals of at most 10000 years, which PostgreSQL compares as 120000 months of 30 days. */
    static final Duration MAX_INTERVAL = Duration.ofDays(10_000L * 12 * 30);

    private SendRules() {}

    /**
     * A sender's timeout bounds each attempt and must end before the lease does: an attempt that
     * outlives its lease runs beside the attempt of the sender that took the send over.
     */
    static void checkTimeout(Duration timeout, Duration lease) {
        if (timeout == null || timeout.isNegative() || timeout.isZero()) {
            throw new IllegalArgumentException("the timeout must be a positive duration (got " + timeout + ")");
        }
        if (lease == null || timeout.compareTo(lease) >= 0) {
            throw new IllegalArgumentException("the timeout (" + timeout.toMillis() + " ms) must be below the lease ("
                    + (lease == null ? "none" : lease.toMillis() + " ms") + "): an attempt that outlives its lease runs"
                    + " beside the attempt of the sender that takes the send over");
        }
    }

    /** A positive interval of at most 10000 years, exact to the microsecond. */
    static Duration checkInterval(String name, Duration value) {
        if (value == null || value.compareTo(Duration.ofNanos(1000)) < 0 || value.compareTo(MAX_INTERVAL) > 0) {
            throw new IllegalArgumentException(name + " must be a positive interval of at least 1 microsecond and"
                    + " at most 10000 years (got " + value + ")");
        }
        return value;
    }

    /** An interval setting's value, exact to the microsecond ("1.500000 seconds"). */
    static String intervalText(Duration value) {
        return value.getSeconds() + "." + String.format("%06d", value.getNano() / 1000) + " seconds";
    }

    /**
     * The extension's settings a sender sets in each of its transactions (checked here: a value the
     * database refuses would fail every call); those given as null stay the database's.
     */
    static Map<String, String> settingValues(Double retryBudget, Duration backoffBase, Duration backoffCap) {
        Map<String, String> values = new LinkedHashMap<>();
        if (retryBudget != null) {
            if (!(retryBudget >= 0 && retryBudget <= MAX_RETRY_BUDGET)) {
                throw new IllegalArgumentException("the retry budget must be a number from 0 to 1000000 (got "
                        + retryBudget + ")");
            }
            values.put("idempotency.send_retry_budget", Double.toString(retryBudget));
        }
        if (backoffBase != null) {
            values.put("idempotency.send_backoff_base", intervalText(checkInterval("the backoff base", backoffBase)));
        }
        if (backoffCap != null) {
            values.put("idempotency.send_backoff_cap", intervalText(checkInterval("the backoff cap", backoffCap)));
        }
        return values;
    }

    /**
     * Milliseconds to wait after the {@code failures}-th database error in a row: exponential
     * backoff with full jitter, anywhere from 0 to min(cap, base * 2^(failures - 1)).
     */
    static long reconnectDelayMillis(int failures, Duration base, Duration cap, DoubleSupplier random) {
        double bound = Math.min(cap.toMillis(), base.toMillis() * Math.pow(2, Math.min(Math.max(failures, 1) - 1, 60)));
        return (long) (random.getAsDouble() * bound);
    }

    /** A database error's SQLSTATE, or its class when it has none (a connection refused). */
    static String errorCode(SQLException e) {
        String state = e.getSQLState();
        return state == null || state.isEmpty() ? e.getClass().getSimpleName() : state;
    }

    /** The first line of an error's message (or its class when it has none). */
    static String firstLine(Throwable e) {
        String m = e.getMessage() == null ? "" : e.getMessage().strip();
        return m.isEmpty() ? e.getClass().getSimpleName() : m.lines().findFirst().orElse(m);
    }
}
