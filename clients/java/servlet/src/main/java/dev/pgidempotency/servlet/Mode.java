package dev.pgidempotency.servlet;

/** How a route runs its handler around the claim. */
public enum Mode {
    /**
     * The claim, the handler's writes (on {@link IdempotencyContext#connection()}) and the stored
     * response commit in one transaction; a duplicate arriving meanwhile waits and then replays.
     */
    SAME_TRANSACTION,
    /**
     * For work outside the database: the claim commits at once with a lease, renewed every third
     * of it while the handler runs; checkpoints record progress, a takeover fences a late completion.
     */
    COMMITTED_FIRST
}
