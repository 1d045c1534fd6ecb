package dev.pgidempotency.http;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;

import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

class StoredResponseTest {
    private static final List<String> ALLOW = List.of("Location", "Content-Type");

    @Test
    void jsonBodiesAreStoredAsJsonAndOnlyAllowListedHeaders() {
        StoredResponse.ToStore s = StoredResponse.toStore(
                List.of(Map.entry("content-type", "application/json"), Map.entry("Location", "/x/1"), Map.entry("X-Other", "no")),
                "{\"id\": 1}".getBytes(StandardCharsets.UTF_8), ALLOW);
        assertEquals("{\"id\": 1}", s.bodyJson());
        assertEquals("{\"Content-Type\":\"application/json\",\"Location\":\"/x/1\"}", s.headersJson());
    }

    @Test
    void textAndBinaryBodiesComeBackByteForByte() {
        byte[] text = "caf\u00e9 \"quoted\"\n".getBytes(StandardCharsets.UTF_8);
        StoredResponse.ToStore t = StoredResponse.toStore(List.of(Map.entry("Content-Type", "text/plain")), text, ALLOW);
        assertEquals("text", ((Map<?, ?>) dev.pgidempotency.Json.parse(t.headersJson())).get(StoredResponse.ENCODING_MARK));
        assertArrayEquals(text, StoredResponse.bodyToSend(t.headersJson(), t.bodyJson()));

        byte[] binary = {0, (byte) 0xff, 1, (byte) 0xc3};
        StoredResponse.ToStore b = StoredResponse.toStore(List.of(Map.entry("Content-Type", "application/octet-stream")), binary, ALLOW);
        assertArrayEquals(binary, StoredResponse.bodyToSend(b.headersJson(), b.bodyJson()));

        byte[] notJson = "{oops".getBytes(StandardCharsets.UTF_8);
        StoredResponse.ToStore n = StoredResponse.toStore(List.of(Map.entry("Content-Type", "application/json")), notJson, ALLOW);
        assertArrayEquals(notJson, StoredResponse.bodyToSend(n.headersJson(), n.bodyJson()));
    }

    @Test
    void aReplayCarriesTheStoredHeadersButNotTheMark() {
        StoredResponse.ToStore t = StoredResponse.toStore(List.of(Map.entry("Content-Type", "text/plain")),
                "hi".getBytes(StandardCharsets.UTF_8), ALLOW);
        HttpAnswer a = StoredResponse.replay(202, t.headersJson(), t.bodyJson());
        assertEquals(202, a.status());
        assertEquals(List.of(Map.entry("Content-Type", "text/plain"), Map.entry("Idempotent-Replayed", "true")), a.headers());
        assertArrayEquals("hi".getBytes(StandardCharsets.UTF_8), a.body());
    }
}
