package dev.pgidempotency.servlet;

import dev.pgidempotency.Claim;
import dev.pgidempotency.Outcome;
import jakarta.servlet.ServletRequest;
import java.sql.Connection;
import java.sql.SQLException;
import java.util.UUID;

/**
 * What a protected request's handler knows about its claim: {@code IdempotencyContext.of(request)}.
 * In same-transaction mode {@link #connection()} is the open transaction of the claim; in
 * committed-first mode the handler records progress with {@link #checkpoint}.
 */
public final class IdempotencyContext {
    /** The request attribute that holds it. */
    public static final String ATTRIBUTE = IdempotencyContext.class.getName();

    private final Mode mode;
    private final Connection connection;
    private final String scope;
    private final String key;
    private final Claim claim;
    private final Lease lease;

    IdempotencyContext(Mode mode, Connection connection, String scope, String key, Claim claim, Lease lease) {
        this.mode = mode;
        this.connection = connection;
        this.scope = scope;
        this.key = key;
        this.claim = claim;
        this.lease = lease;
    }

    /** The request's context, or null when the filter did not protect it. */
    public static IdempotencyContext of(ServletRequest request) {
        return (IdempotencyContext) request.getAttribute(ATTRIBUTE);
    }

    public Mode mode() {
        return mode;
    }

    /** Same-transaction mode: the connection inside the claim's transaction (do not commit or close it). */
    public Connection connection() {
        if (connection == null) {
            throw new IllegalStateException("only same-transaction routes run inside the claim's transaction");
        }
        return connection;
    }

    public String scope() {
        return scope;
    }

    /** The key, or null when the route's key is optional and the request had none. */
    public String key() {
        return key;
    }

    public UUID token() {
        return claim == null ? null : claim.token();
    }

    /** CLAIMED, or RECLAIMED when this request took over a dead owner's claim; null without a key. */
    public Outcome outcome() {
        return claim == null ? null : claim.outcome();
    }

    public int attempts() {
        return claim == null ? 0 : claim.attempts();
    }

    /** Where a dead earlier attempt got to (committed-first), or null; "started" means nothing recorded. */
    public String recoveryPoint() {
        return claim == null ? null : claim.recoveryPoint();
    }

    /** Its data as JSON text, or null. */
    public String recoveryDataJson() {
        return claim == null ? null : claim.recoveryDataJson();
    }

    /**
     * Committed-first: records progress (and renews the lease) on a connection of its own. This
     * marks that a side effect started: a failure after it is stored, not released.
     */
    public void checkpoint(String point, String dataJson) throws SQLException {
        committedLease().checkpoint(null, point, dataJson);
    }

    /**
     * Committed-first: the same, inside the caller's transaction on {@code db}: the checkpoint then
     * fences that write (it fails with IK002 when the claim was taken over).
     */
    public void checkpoint(Connection db, String point, String dataJson) throws SQLException {
        committedLease().checkpoint(db, point, dataJson);
    }

    /** Committed-first: marks that a side effect started without recording a checkpoint. */
    public void sideEffectStarted() {
        committedLease().sideEffects = true;
    }

    /** Committed-first: whether the renewal found the claim taken over (stop working: the result will not be reported). */
    public boolean lost() {
        return lease != null && lease.lost;
    }

    private Lease committedLease() {
        if (lease == null) {
            throw new IllegalStateException("checkpoints are for committed-first routes with a key");
        }
        return lease;
    }
}
