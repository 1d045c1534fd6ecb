package dev.pgidempotency;

import java.time.OffsetDateTime;
import java.util.UUID;

/**
 * One {@code idem_claim} answer. JSON columns are kept as the text jsonb prints, so a replay can
 * send the stored body byte for byte.
 *
 * @param retryAfterSeconds for {@code in_progress}: whole seconds until the owner's lease ends (at least 1)
 */
public record Claim(
        Outcome outcome,
        UUID token,
        Integer httpStatus,
        Integer responseStatus,
        String responseHeadersJson,
        String responseBodyJson,
        String recoveryPoint,
        String recoveryDataJson,
        int attempts,
        OffsetDateTime expiresAt,
        OffsetDateTime lockedUntil,
        Integer retryAfterSeconds) {}
