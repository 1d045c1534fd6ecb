package dev.pgidempotency;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.math.BigDecimal;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;
import org.junit.jupiter.params.provider.ValueSource;

class JsonTest {
    /** RFC 8785 Appendix B: IEEE 754 bit patterns and how ECMAScript (so JCS) writes them. */
    @ParameterizedTest
    @CsvSource({
        "0000000000000000, 0",
        "8000000000000000, 0",
        "0000000000000001, 5e-324",
        "8000000000000001, -5e-324",
        "7fefffffffffffff, 1.7976931348623157e+308",
        "ffefffffffffffff, -1.7976931348623157e+308",
        "4340000000000000, 9007199254740992",
        "c340000000000000, -9007199254740992",
        "4430000000000000, 295147905179352830000",
        "44b52d02c7e14af5, 9.999999999999997e+22",
        "44b52d02c7e14af6, 1e+23",
        "44b52d02c7e14af7, 1.0000000000000001e+23",
        "444b1ae4d6e2ef4e, 999999999999999700000",
        "444b1ae4d6e2ef4f, 999999999999999900000",
        "444b1ae4d6e2ef50, 1e+21",
        "3eb0c6f7a0b5ed8c, 9.999999999999997e-7",
        "3eb0c6f7a0b5ed8d, 0.000001",
        "41b3de4355555553, 333333333.3333332",
        "41b3de4355555554, 333333333.33333325",
        "41b3de4355555555, 333333333.3333333",
        "41b3de4355555556, 333333333.3333334",
        "41b3de4355555557, 333333333.33333343",
        "becbf647612f3696, -0.0000033333333333333333",
        "43143ff3c1cb0959, 1424953923781206.2",
    })
    void numbersAsEcmaScriptWritesThem(String bits, String expected) {
        double x = Double.longBitsToDouble(Long.parseUnsignedLong(bits, 16));
        assertEquals(expected, Json.ecmaNumber(x, null));
    }

    @Test
    void canonicalFormSortsMembersByUtf16CodeUnits() {
        // RFC 8785 section 3.2.3's sorting example
        String text = "{\"\\u20ac\":\"Euro Sign\",\"\\r\":\"Carriage Return\",\"\\ufb33\":\"Hebrew Letter Dalet With Dagesh\","
                + "\"1\":\"One\",\"\\ud83d\\ude00\":\"Emoji: Grinning Face\",\"\\u0080\":\"Control\","
                + "\"\\u00f6\":\"Latin Small Letter O With Diaeresis\"}";
        String expected = "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u0080\":\"Control\",\"\u00f6\":\"Latin Small Letter O With Diaeresis\","
                + "\"\u20ac\":\"Euro Sign\",\"\ud83d\ude00\":\"Emoji: Grinning Face\",\"\ufb33\":\"Hebrew Letter Dalet With Dagesh\"}";
        assertEquals(expected, Json.canonical(Json.parse(text)));
    }

    @Test
    void canonicalFormOfTheRfcsMainExample() {
        String text = """
                {
                  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
                  "string": "\\u20ac$\\u000F\\u000aA'\\u0042\\u0022\\u005c\\\\\\"\\/",
                  "literals": [null, true, false]
                }""";
        String expected = "{\"literals\":[null,true,false],\"numbers\":[333333333.3333333,1e+30,4.5,0.002,1e-27],"
                + "\"string\":\"\u20ac$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\"}";
        assertEquals(expected, Json.canonical(Json.parse(text)));
    }

    @Test
    void repeatedNamesKeepTheLastValueAsJsonbDoes() {
        assertEquals("{\"a\":2}", Json.canonical(Json.parse("{\"a\":1,\"a\":2}")));
    }

    @Test
    void writeKeepsOrderAndExactNumbers() {
        Object v = Json.parse("{\"b\":[1,2.50,\"x\"],\"a\":{\"c\":null}}");
        assertEquals("{\"b\":[1,2.50,\"x\"],\"a\":{\"c\":null}}", Json.write(v));
        assertEquals(new BigDecimal("2.50"), ((List<?>) ((Map<?, ?>) v).get("b")).get(1));
    }

    @ParameterizedTest
    @ValueSource(strings = {"", "{", "[1,]", "{\"a\" 1}", "01", "1.", "-", "tru", "\"a", "\"\\x\"", "\"\\ud800\"",
        "[1] 2", "{\"a\":1,}", "\"tab\there\"", "NaN", "1e400"})
    void refusesWhatIsNotJson(String text) {
        assertThrows(Json.JsonException.class, () -> Json.canonical(Json.parse(text)));
    }

    @Test
    void refusesInvalidUtf8AndDeepNesting() {
        assertThrows(Json.JsonException.class, () -> Json.parse(new byte[] {'"', (byte) 0xc3, '"'}));
        String deep = "[".repeat(1001) + "]".repeat(1001);
        assertEquals("[".repeat(1000) + "]".repeat(1000), Json.canonical(Json.parse("[".repeat(1000) + "]".repeat(1000))));
        assertThrows(Json.JsonException.class, () -> Json.parse(deep.getBytes(StandardCharsets.UTF_8)));
    }
}
