package dev.pgidempotency.http;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

class IdempotencyKeyTest {
    private static String one(String v) throws IdempotencyKey.Refused {
        return IdempotencyKey.parse(List.of(v));
    }

    @Test
    void acceptsQuotedStringsAndBareTokens() throws Exception {
        assertEquals("8e03978e-40d5", one("\"8e03978e-40d5\""));
        assertEquals("a b", one("  \"a b\" "));
        assertEquals("a\"b\\c", one("\"a\\\"b\\\\c\""));
        assertEquals("tok-1:a/b", one("tok-1:a/b"));
        assertEquals("8e03978e-40d5-43e8", one("8e03978e-40d5-43e8")); // a bare UUID, as most clients send it
        assertEquals(255, one("k".repeat(255)).length());
        assertEquals(255, one("\"" + "k".repeat(255) + "\"").length());
    }

    @ParameterizedTest
    @ValueSource(strings = {"", "  ", "\"\"", "\"abc", "\"a\"b", "\"a\";p=1", "tok;p=1", "\"a\\nb\"", "a b", "a,b",
        "\"a\tb\"", "\"a\u0001b\"", "a\u007fb", "\"caf\u00e9\"", "caf\u00e9", "?1", "(a b)", "@x"})
    void refusesMalformedValuesAsInvalid(String bad) {
        IdempotencyKey.Refused e = assertThrows(IdempotencyKey.Refused.class, () -> one(bad));
        assertEquals(Problem.KEY_INVALID, e.problem(), e.getMessage());
    }

    @Test
    void refusesMissingRepeatedAndTooLong() {
        assertEquals(Problem.KEY_MISSING, assertThrows(IdempotencyKey.Refused.class, () -> IdempotencyKey.parse(List.of())).problem());
        assertEquals(Problem.KEY_INVALID,
                assertThrows(IdempotencyKey.Refused.class, () -> IdempotencyKey.parse(List.of("\"a\"", "\"b\""))).problem());
        assertThrows(IdempotencyKey.Refused.class, () -> one("k".repeat(256)));
        assertThrows(IdempotencyKey.Refused.class, () -> one("\"" + "k".repeat(256) + "\""));
    }
}
