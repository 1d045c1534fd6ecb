package dev.pgidempotency;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.sql.Connection;
import java.util.List;
import java.util.Random;
import java.util.Set;
import org.junit.jupiter.api.Test;

/** The client-side fingerprint (RFC 8785 + SHA-256) equals the database's idem_fingerprint. */
class FingerprintTest {
    private final IdempotencyClient idem = new IdempotencyClient();

    @Test
    void knownValues() {
        // The contract's example: the same JSON written differently has one fingerprint.
        assertEquals(Fingerprint.ofJson("{\"b\":1,\"a\":2}".getBytes(java.nio.charset.StandardCharsets.UTF_8), Set.of()),
                Fingerprint.ofJson("{ \"a\": 2, \"b\": 1.0 }".getBytes(java.nio.charset.StandardCharsets.UTF_8), Set.of()));
        assertEquals("sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
                Fingerprint.of(java.util.Map.of(), Set.of()));
    }

    @Test
    void equalToIdemFingerprintOnGeneratedDocuments() throws Exception {
        Random rnd = new Random(20251201);
        try (Connection c = Databases.connect("DATABASE_URL")) {
            for (int i = 0; i < 400; i++) {
                String text = new Gen(rnd).value(0);
                List<String> ignore = i % 3 == 0 ? List.of("a", "\u00e9") : List.of();
                String mine = Fingerprint.ofJson(text.getBytes(java.nio.charset.StandardCharsets.UTF_8), Set.copyOf(ignore));
                String theirs = idem.fingerprint(c, text, ignore.isEmpty() ? null : ignore);
                assertEquals(theirs, mine, "document " + i + ": " + text);
            }
        }
    }

    /** Random JSON text: every kind of value, numbers spelled many ways, strings with escapes and non-ASCII. */
    private static final class Gen {
        private final Random rnd;

        Gen(Random rnd) {
            this.rnd = rnd;
        }

        String value(int depth) {
            int kind = rnd.nextInt(depth > 3 ? 4 : 6);
            return switch (kind) {
                case 0 -> number();
                case 1 -> string();
                case 2 -> List.of("true", "false", "null").get(rnd.nextInt(3));
                case 3 -> number();
                case 4 -> {
                    StringBuilder b = new StringBuilder("[");
                    int n = rnd.nextInt(5);
                    for (int i = 0; i < n; i++) {
                        b.append(i > 0 ? "," : "").append(space()).append(value(depth + 1)).append(space());
                    }
                    yield b.append("]").toString();
                }
                default -> {
                    StringBuilder b = new StringBuilder("{");
                    int n = rnd.nextInt(6);
                    for (int i = 0; i < n; i++) {
                        String name = rnd.nextInt(4) == 0 ? List.of("\"a\"", "\"\\u00e9\"", "\"b\"").get(rnd.nextInt(3)) : string();
                        b.append(i > 0 ? "," : "").append(space()).append(name).append(space()).append(':').append(value(depth + 1));
                    }
                    yield b.append("}").toString();
                }
            };
        }

        String space() {
            return List.of("", "", " ", "\n\t ").get(rnd.nextInt(4));
        }

        String number() {
            switch (rnd.nextInt(7)) {
                case 0:
                    return Integer.toString(rnd.nextInt(2001) - 1000);
                case 1:
                    return Long.toString(rnd.nextLong());
                case 2: {
                    double x;
                    do {
                        x = Double.longBitsToDouble(rnd.nextLong());
                    } while (Double.isNaN(x) || Double.isInfinite(x));
                    return Double.toString(x).replace("E", rnd.nextBoolean() ? "e" : "E+").replace("E+-", "E-");
                }
                case 3:
                    return (rnd.nextBoolean() ? "-" : "") + rnd.nextInt(1000) + "." + rnd.nextInt(1000) + "0".repeat(rnd.nextInt(3));
                case 4:
                    return rnd.nextInt(10) + "e" + (rnd.nextInt(60) - 30);
                case 5:
                    return "0." + "0".repeat(rnd.nextInt(9)) + (1 + rnd.nextInt(99999));
                default:
                    return (1 + rnd.nextInt(9)) + "" + Math.abs(rnd.nextLong()) + Math.abs(rnd.nextLong());
            }
        }

        String string() {
            StringBuilder b = new StringBuilder("\"");
            int n = rnd.nextInt(8);
            for (int i = 0; i < n; i++) {
                switch (rnd.nextInt(8)) {
                    case 0 -> b.append("\\n\\t\\\"\\\\\\/");
                    case 1 -> b.append("\\u00").append(Integer.toHexString(0x10 + rnd.nextInt(0x10)));
                    case 2 -> b.append("\u00e9\u20ac");
                    case 3 -> b.append("\ud83d\ude00");
                    case 4 -> b.append("\\ud83d\\ude00");
                    case 5 -> b.append("\\u0001\\u001f\\u007f");
                    default -> b.append((char) ('a' + rnd.nextInt(26)));
                }
            }
            return b.append('"').toString();
        }
    }
}
