package dev.pgidempotency;

import java.time.Duration;
import java.util.UUID;

/**
 * The optional arguments of {@code idem_claim}; {@code null} leaves the extension's default.
 * {@code waitFor} (the SQL argument {@code wait}) and {@code token} (extension 0.4.0) and
 * {@code deferred} (0.6.0) are passed only when the installed extension has them.
 *
 * <p>{@code deferred}: for a claim in the same transaction as the work and its {@code idem_complete}
 * only. A claim of a free key then writes nothing until {@code idem_complete} writes the completed
 * record once (docs/reference.md, "deferred"); a COMMIT without a complete writes the in_progress
 * record, as a claim without it would have.
 */
public record ClaimOptions(String fingerprint, Duration ttl, Duration lease, Duration waitFor, UUID token,
        boolean deferred) {
    public static final ClaimOptions NONE = new ClaimOptions(null, null, null, null, null, false);

    public ClaimOptions withFingerprint(String v) {
        return new ClaimOptions(v, ttl, lease, waitFor, token, deferred);
    }

    public ClaimOptions withTtl(Duration v) {
        return new ClaimOptions(fingerprint, v, lease, waitFor, token, deferred);
    }

    public ClaimOptions withLease(Duration v) {
        return new ClaimOptions(fingerprint, ttl, v, waitFor, token, deferred);
    }

    public ClaimOptions withWaitFor(Duration v) {
        return new ClaimOptions(fingerprint, ttl, lease, v, token, deferred);
    }

    public ClaimOptions withToken(UUID v) {
        return new ClaimOptions(fingerprint, ttl, lease, waitFor, v, deferred);
    }

    public ClaimOptions withDeferred(boolean v) {
        return new ClaimOptions(fingerprint, ttl, lease, waitFor, token, v);
    }
}
