package dev.pgidempotency;

import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.Collection;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * A request's fingerprint, the same text as {@code idempotency.idem_fingerprint(jsonb, ignore)}:
 * {@code "sha256:" + hex(SHA-256(RFC 8785 canonical JSON))}.
 */
public final class Fingerprint {
    private Fingerprint() {}

    /** @param ignore top-level members left out (only when {@code value} is an object) */
    public static String of(Object value, Collection<String> ignore) {
        Object v = value;
        if (!ignore.isEmpty() && v instanceof Map<?, ?> m) {
            Map<Object, Object> kept = new LinkedHashMap<>(m);
            kept.keySet().removeAll(ignore);
            v = kept;
        }
        return "sha256:" + sha256Hex(Json.canonical(v).getBytes(StandardCharsets.UTF_8));
    }

    /** The fingerprint of a JSON text (UTF-8); a text that is not JSON is a {@link Json.JsonException}. */
    public static String ofJson(byte[] utf8, Collection<String> ignore) {
        return of(Json.parse(utf8), ignore);
    }

    /** {@code idem_fingerprint(bytea)}: the SHA-256 of the bytes themselves. */
    public static String ofBytes(byte[] bytes) {
        return "sha256:" + sha256Hex(bytes);
    }

    private static String sha256Hex(byte[] bytes) {
        try {
            return HexFormat.of().formatHex(MessageDigest.getInstance("SHA-256").digest(bytes));
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException("every Java runtime has SHA-256", e);
        }
    }
}
