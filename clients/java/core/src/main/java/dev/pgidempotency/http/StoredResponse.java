package dev.pgidempotency.http;

import dev.pgidempotency.Json;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;

/**
 * How a response is stored with {@code idem_complete} and sent again on replay, byte for byte (the
 * same rules as the Python package).
 *
 * <p>A JSON body (a JSON Content-Type and valid JSON) is stored as jsonb and sent as jsonb prints it,
 * the first time and on every replay. Any other body is stored as a JSON string: its text, or the
 * base64 of its bytes when they are not UTF-8 or hold NUL; the stored headers then carry the mark
 * {@link #ENCODING_MARK} (not a valid header name, so it never collides with one and is never sent).
 */
public final class StoredResponse {
    public static final String ENCODING_MARK = ":body-encoding";
    public static final String REPLAYED_HEADER = "Idempotent-Replayed";
    /**
     * A handler's own answers that mean "refused before any work" (contract.json's
     * {@code refused_statuses}): never stored, the key is released, so the same key with a
     * corrected request runs as new.
     */
    public static final Set<Integer> REFUSED_STATUSES = Set.of(400, 401, 403, 404, 405, 406, 408, 411, 413, 414, 415,
            422, 429);

    private StoredResponse() {}

    /** What {@code idem_complete} gets: the body and the allow-listed headers, as JSON texts. */
    public record ToStore(String bodyJson, String headersJson) {}

    public static boolean isJsonType(String contentType) {
        if (contentType == null) {
            return false;
        }
        String media = contentType.split(";", 2)[0].trim().toLowerCase(Locale.ROOT);
        return media.equals("application/json") || media.endsWith("+json");
    }

    /**
     * @param headers the response's header lines
     * @param allow the header names stored (and replayed), compared without case; Content-Type is always stored
     */
    public static ToStore toStore(List<Map.Entry<String, String>> headers, byte[] body, Collection<String> allow) {
        String contentType = null;
        Map<String, Object> stored = new LinkedHashMap<>();
        for (Map.Entry<String, String> h : headers) {
            if (h.getKey().equalsIgnoreCase("Content-Type")) {
                contentType = h.getValue();
                stored.putIfAbsent("Content-Type", h.getValue());
                continue;
            }
            for (String name : allow) {
                if (name.equalsIgnoreCase(h.getKey())) {
                    stored.putIfAbsent(name, h.getValue());
                }
            }
        }
        String bodyJson = null;
        if (isJsonType(contentType)) {
            try {
                String text = utf8(body);
                Json.parse(text);
                bodyJson = text;
            } catch (CharacterCodingException | Json.JsonException e) {
                bodyJson = null; // stored as text or base64 below
            }
        }
        if (bodyJson == null) {
            String text = null;
            try {
                text = utf8(body);
            } catch (CharacterCodingException e) {
                text = null;
            }
            if (text != null && text.indexOf('\0') < 0) { // jsonb strings cannot hold NUL
                bodyJson = Json.quote(text);
                stored.put(ENCODING_MARK, "text");
            } else {
                bodyJson = Json.quote(Base64.getEncoder().encodeToString(body));
                stored.put(ENCODING_MARK, "base64");
            }
        }
        return new ToStore(bodyJson, Json.write(stored));
    }

    /** The bytes to send for a stored body (jsonb text), given the stored headers. */
    public static byte[] bodyToSend(String storedHeadersJson, String storedBodyJson) {
        if (storedBodyJson == null) {
            return new byte[0];
        }
        Object mark = storedHeaders(storedHeadersJson).get(ENCODING_MARK);
        if ("text".equals(mark)) {
            return ((String) Json.parse(storedBodyJson)).getBytes(StandardCharsets.UTF_8);
        }
        if ("base64".equals(mark)) {
            return Base64.getDecoder().decode((String) Json.parse(storedBodyJson));
        }
        return storedBodyJson.getBytes(StandardCharsets.UTF_8);
    }

    /** A stored response as it is replayed: stored status, headers and body, plus Idempotent-Replayed: true. */
    public static HttpAnswer replay(int status, String storedHeadersJson, String storedBodyJson) {
        HttpAnswer a = new HttpAnswer(status, new java.util.ArrayList<>(), bodyToSend(storedHeadersJson, storedBodyJson));
        storedHeaders(storedHeadersJson).forEach((name, value) -> {
            if (!name.equals(ENCODING_MARK)) {
                a.headers().add(Map.entry(name, String.valueOf(value)));
            }
        });
        a.headers().add(Map.entry(REPLAYED_HEADER, "true"));
        return a;
    }

    @SuppressWarnings("unchecked")
    private static Map<String, Object> storedHeaders(String json) {
        if (json == null) {
            return Map.of();
        }
        Object v = Json.parse(json);
        return v instanceof Map<?, ?> ? (Map<String, Object>) v : Map.of();
    }

    private static String utf8(byte[] bytes) throws CharacterCodingException {
        return StandardCharsets.UTF_8.newDecoder()
                .onMalformedInput(CodingErrorAction.REPORT)
                .onUnmappableCharacter(CodingErrorAction.REPORT)
                .decode(ByteBuffer.wrap(bytes))
                .toString();
    }
}
