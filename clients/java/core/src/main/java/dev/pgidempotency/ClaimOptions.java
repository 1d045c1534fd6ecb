package dev.pgidempotency;

import java.time.Duration;
import java.util.UUID;

/**
 * The optional arguments of {@code idem_claim}; {@code null} leaves the extension's default.
 * {@code waitFor} (the SQL argument {@code wait}) and {@code token} (extension 0.4.0) are passed only when the installed extension has
 * them.
 */
public record ClaimOptions(String fingerprint, Duration ttl, Duration lease, Duration waitFor, UUID token) {
    public static final ClaimOptions NONE = new ClaimOptions(null, null, null, null, null);

    public ClaimOptions withFingerprint(String v) {
        return new ClaimOptions(v, ttl, lease, waitFor, token);
    }

    public ClaimOptions withTtl(Duration v) {
        return new ClaimOptions(fingerprint, v, lease, waitFor, token);
    }

    public ClaimOptions withLease(Duration v) {
        return new ClaimOptions(fingerprint, ttl, v, waitFor, token);
    }

    public ClaimOptions withWaitFor(Duration v) {
        return new ClaimOptions(fingerprint, ttl, lease, v, token);
    }

    public ClaimOptions withToken(UUID v) {
        return new ClaimOptions(fingerprint, ttl, lease, waitFor, v);
    }
}
