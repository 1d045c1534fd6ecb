package dev.pgidempotency.http;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/** An HTTP answer the middleware writes itself: status, header lines (repeatable) and body. */
public record HttpAnswer(int status, List<Map.Entry<String, String>> headers, byte[] body) {
    public HttpAnswer(int status, String body) {
        this(status, new ArrayList<>(), body.getBytes(StandardCharsets.UTF_8));
    }

    /** The first value of a header, names compared without case, or null. */
    public String header(String name) {
        for (Map.Entry<String, String> h : headers) {
            if (h.getKey().equalsIgnoreCase(name)) {
                return h.getValue();
            }
        }
        return null;
    }
}
