package dev.pgidempotency.servlet;

import dev.pgidempotency.IdempotencyClient;
import dev.pgidempotency.IdempotencyException;
import java.sql.Connection;
import java.sql.SQLException;
import java.time.Duration;
import java.util.UUID;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;

/** Keeps a committed claim's lease alive: idem_checkpoint every third of the lease, on a pool connection. */
final class Lease {
    private static final System.Logger LOG = System.getLogger(IdempotencyFilter.class.getName());

    private final IdempotencyClient client;
    private final BoundedConnections connections;
    private final String scope;
    private final String key;
    private final UUID token;
    private final Duration lease;
    private final ScheduledFuture<?> renewal;
    private String point;
    private String dataJson;
    volatile boolean sideEffects;
    volatile boolean lost;

    Lease(IdempotencyClient client, BoundedConnections connections, ScheduledExecutorService timer, String scope, String key,
            UUID token, Duration lease, String point, String dataJson) {
        this.client = client;
        this.connections = connections;
        this.scope = scope;
        this.key = key;
        this.token = token;
        this.lease = lease;
        this.point = point == null ? "started" : point;
        this.dataJson = dataJson;
        long every = Math.max(50, lease.toMillis() / 3);
        this.renewal = timer.scheduleWithFixedDelay(this::renew, every, every, TimeUnit.MILLISECONDS);
    }

    private synchronized void renew() {
        if (lost) {
            return;
        }
        try (Connection db = connections.get()) {
            client.checkpoint(db, scope, key, token, point, dataJson, lease);
        } catch (IdempotencyException.ClaimTakenOver | IdempotencyException.NoLiveRecord e) {
            lost = true;
            LOG.log(System.Logger.Level.WARNING, "pg-idempotency: {0} {1}: the claim was lost while the handler ran ({2})",
                    scope, key, e.getSQLState());
        } catch (SQLException | RuntimeException e) {
            LOG.log(System.Logger.Level.WARNING, "pg-idempotency: {0} {1}: lease renewal failed: {2}", scope, key, e.getMessage());
        }
    }

    synchronized void checkpoint(Connection db, String newPoint, String newDataJson) throws SQLException {
        sideEffects = true;
        if (db != null) {
            client.checkpoint(db, scope, key, token, newPoint, newDataJson, lease);
        } else {
            try (Connection own = connections.get()) {
                client.checkpoint(own, scope, key, token, newPoint, newDataJson, lease);
            }
        }
        point = newPoint;
        dataJson = newDataJson;
    }

    /** Stops the renewal and waits for one under way. */
    void stop() {
        renewal.cancel(false);
        synchronized (this) {
            // a renewal running now has finished once we hold the lock
        }
    }
}
