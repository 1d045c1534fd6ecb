package dev.pgidempotency;

import java.time.OffsetDateTime;
import java.util.Map;

/** Where one send stands after an attempt, or when looked up (docs/sending.md). */
public sealed interface SendResult {
    /** The receiver's final answer (any status that is not retried, 4xx included). Header names in lower case. */
    record Delivered(int status, Map<String, String> headers, String body) implements SendResult {}

    /**
     * No final answer yet: {@code pending} (a retry is due at {@code nextAttemptAt}) or {@code sending}
     * (another sender holds it now). A worker finishes it. {@code lastStatus} null: no answer.
     */
    record NotYet(String state, int attempts, OffsetDateTime nextAttemptAt, Integer lastStatus, String lastError)
            implements SendResult {}

    /**
     * Gave up: no final answer came before give_up_at. The receiver may or may not have done the
     * work: look it up there by {@code key}; never send the operation again with a new key.
     */
    record Unknown(String key, int attempts, Integer lastStatus, String lastError) implements SendResult {}

    /** This sender's lease ended and another sender took the send over (IK002): not recorded. */
    record Lost(String scope, String operation) implements SendResult {}
}
