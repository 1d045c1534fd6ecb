package dev.pgidempotency.http;

import dev.pgidempotency.Json;
import dev.pgidempotency.Outcome;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * The problem answers (RFC 9457) of the HTTP mapping, as contract/contract.json describes them: type
 * = {@link #TYPE_PREFIX} + slug, status, title, detail, and whether a Retry-After goes with it. The
 * package's tests check this table against contract/contract.json.
 */
public enum Problem {
    KEY_MISSING("idempotency-key-missing", 400, "Idempotency-Key missing",
            "This request requires an Idempotency-Key header.", false),
    KEY_INVALID("idempotency-key-invalid", 400, "Idempotency-Key invalid",
            "The Idempotency-Key header must appear once and hold 1 to 255 characters, none of them control characters.",
            false),
    IN_PROGRESS("idempotency-key-in-progress", 409, "Request in progress",
            "A request with this Idempotency-Key is still being processed. Retry later.", true),
    SUPERSEDED("idempotency-key-superseded", 409, "Request taken over",
            "This attempt lost its claim on the Idempotency-Key to a later one. Retry to get the result.", true),
    REUSED("idempotency-key-reused", 422, "Idempotency-Key reused",
            "This Idempotency-Key was used with a different request payload. Use a new key for a new request.", false),
    EXPIRED("idempotency-key-expired", 410, "Idempotency-Key expired",
            "This Idempotency-Key was used and its stored response has expired. Use a new key.", false),
    SERVICE_UNAVAILABLE("service-unavailable", 503, "Service unavailable",
            "The database could not be reached; nothing was done. Retry later.", true),
    INTERNAL_ERROR("internal-error", 500, "Internal server error", "The request failed.", false);

    public static final String TYPE_PREFIX = "urn:pg-idempotency:problem:";
    public static final String CONTENT_TYPE = "application/problem+json";

    private final String slug;
    private final int status;
    private final String title;
    private final String detail;
    private final boolean retryAfter;

    Problem(String slug, int status, String title, String detail, boolean retryAfter) {
        this.slug = slug;
        this.status = status;
        this.title = title;
        this.detail = detail;
        this.retryAfter = retryAfter;
    }

    public String slug() {
        return slug;
    }

    public String type() {
        return TYPE_PREFIX + slug;
    }

    public int status() {
        return status;
    }

    public String title() {
        return title;
    }

    public String detail() {
        return detail;
    }

    /** Whether the answer carries a Retry-After header. */
    public boolean retryAfter() {
        return retryAfter;
    }

    /** The problem a claim outcome answers with, or null for the outcomes that run or replay. */
    public static Problem forOutcome(Outcome o) {
        return switch (o) {
            case IN_PROGRESS -> IN_PROGRESS;
            case MISMATCH -> REUSED;
            case EXPIRED -> EXPIRED;
            case CLAIMED, RECLAIMED, REPLAY -> null;
        };
    }

    /** The answer; {@code retryAfterSeconds} is used when this problem carries Retry-After (at least 1). */
    public HttpAnswer answer(Integer retryAfterSeconds) {
        HttpAnswer a = problem(status, type(), title, detail);
        if (retryAfter) {
            a.headers().add(Map.entry("Retry-After", Integer.toString(Math.max(1, retryAfterSeconds == null ? 1 : retryAfterSeconds))));
        }
        return a;
    }

    public HttpAnswer answer() {
        return answer(1);
    }

    /** Any problem+json answer (e.g. an application's 401 or 400). */
    public static HttpAnswer problem(int status, String type, String title, String detail) {
        Map<String, Object> body = new LinkedHashMap<>();
        body.put("type", type);
        body.put("title", title);
        body.put("status", status);
        body.put("detail", detail);
        HttpAnswer a = new HttpAnswer(status, Json.write(body));
        a.headers().add(Map.entry("Content-Type", CONTENT_TYPE));
        return a;
    }
}
