package dev.pgidempotency;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.SQLException;
import java.sql.SQLTransientConnectionException;
import java.time.Duration;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.postgresql.ds.PGSimpleDataSource;

/** The sender's pure rules. */
class SendRulesTest {
    @Test
    void theTimeoutMustBePositiveAndBelowTheLease() {
        SendRules.checkTimeout(Duration.ofMillis(999), Duration.ofSeconds(1));
        for (Duration bad : new Duration[] {Duration.ofSeconds(1), Duration.ofSeconds(2), Duration.ZERO, Duration.ofMillis(-1)}) {
            assertThrows(IllegalArgumentException.class, () -> SendRules.checkTimeout(bad, Duration.ofSeconds(1)), bad::toString);
        }
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> Sender.builder(new PGSimpleDataSource())
                .url("t", "http://127.0.0.1:9/").timeout(Duration.ofMillis(1500)).lease(Duration.ofMillis(1500)).build());
        assertEquals("the timeout (1500 ms) must be below the lease (1500 ms): an attempt that outlives its lease runs"
                + " beside the attempt of the sender that takes the send over", e.getMessage());
    }

    @Test
    void settingsAreWrittenAsTheExtensionReadsThemAndCheckedFirst() {
        assertEquals(Map.of(), SendRules.settingValues(null, null, null));
        assertEquals(Map.of("idempotency.send_retry_budget", "0.0", "idempotency.send_backoff_base", "0.010000 seconds",
                "idempotency.send_backoff_cap", "3600.000001 seconds"),
                SendRules.settingValues(0.0, Duration.ofMillis(10), Duration.ofHours(1).plusNanos(1500)));
        assertEquals("1000000.0", SendRules.settingValues(1e6, null, null).get("idempotency.send_retry_budget"));
        for (double bad : new double[] {-0.1, 1_000_000.5, Double.NaN, Double.POSITIVE_INFINITY}) {
            assertThrows(IllegalArgumentException.class, () -> SendRules.settingValues(bad, null, null), () -> "" + bad);
        }
        for (Duration bad : new Duration[] {Duration.ZERO, Duration.ofNanos(999), Duration.ofSeconds(-1),
                SendRules.MAX_INTERVAL.plusSeconds(1)}) {
            assertThrows(IllegalArgumentException.class, () -> SendRules.settingValues(null, bad, null), bad::toString);
            assertThrows(IllegalArgumentException.class, () -> SendRules.settingValues(null, null, bad), bad::toString);
        }
        assertEquals("311040000000.000000 seconds", SendRules.intervalText(SendRules.MAX_INTERVAL));
        assertThrows(IllegalArgumentException.class, () -> Sender.builder(new PGSimpleDataSource())
                .url("t", "http://127.0.0.1:9/").giveUpAfter(Duration.ZERO).build());
        assertThrows(IllegalArgumentException.class, () -> Sender.builder(new PGSimpleDataSource())
                .url("t", "http://127.0.0.1:9/").retryBudget(-1.0).build());
    }

    @Test
    void reconnectionsBackOffExponentiallyWithFullJitter() {
        Duration base = Duration.ofMillis(100);
        Duration cap = Duration.ofSeconds(5);
        assertEquals(100, SendRules.reconnectDelayMillis(1, base, cap, () -> 1.0));
        assertEquals(200, SendRules.reconnectDelayMillis(2, base, cap, () -> 1.0));
        assertEquals(3200, SendRules.reconnectDelayMillis(6, base, cap, () -> 1.0));
        assertEquals(5000, SendRules.reconnectDelayMillis(7, base, cap, () -> 1.0), "the cap");
        assertEquals(5000, SendRules.reconnectDelayMillis(10_000, base, cap, () -> 1.0), "no overflow");
        assertEquals(0, SendRules.reconnectDelayMillis(3, base, cap, () -> 0.0), "full jitter: from 0");
        assertEquals(200, SendRules.reconnectDelayMillis(3, base, cap, () -> 0.5));
    }

    @Test
    void errorCodesAndFirstLines() {
        assertEquals("57P01", Sender.errorCode(new SQLException("terminating connection", "57P01")));
        assertEquals("SQLTransientConnectionException", Sender.errorCode(new SQLTransientConnectionException("refused")));
        assertEquals("one", Sender.firstLine(new SQLException("one\ntwo")));
        assertEquals("SQLException", Sender.firstLine(new SQLException()));
        assertTrue(Sender.firstLine(new SQLException("  x  ")).equals("x"));
    }
}
