package dev.pgidempotency;

import java.math.BigDecimal;
import java.math.MathContext;
import java.math.RoundingMode;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * A small JSON reader and writer (RFC 8259), and RFC 8785 canonical JSON (JCS), so the package
 * needs no JSON library.
 *
 * <p>Values: {@code null}, {@link Boolean}, {@link BigDecimal} (numbers, exactly as written),
 * {@link String}, {@code List<Object>} and {@code Map<String, Object>} (insertion order; a repeated
 * name keeps its last value, as PostgreSQL's jsonb does).
 */
public final class Json {
    private static final int MAX_DEPTH = 1000;

    private Json() {}

    /** A text that is not JSON (or a value that cannot be written as JSON). */
    public static final class JsonException extends IllegalArgumentException {
        private static final long serialVersionUID = 1L;

        public JsonException(String message) {
            super(message);
        }
    }

    /** Parses UTF-8 bytes; invalid UTF-8 is a {@link JsonException}. */
    public static Object parse(byte[] utf8) {
        try {
            String text = StandardCharsets.UTF_8.newDecoder()
                    .onMalformedInput(CodingErrorAction.REPORT)
                    .onUnmappableCharacter(CodingErrorAction.REPORT)
                    .decode(ByteBuffer.wrap(utf8))
                    .toString();
            return parse(text);
        } catch (CharacterCodingException e) {
            throw new JsonException("the text is not UTF-8");
        }
    }

    public static Object parse(String text) {
        Reader r = new Reader(text);
        r.space();
        Object value = r.value(0);
        r.space();
        if (r.pos != text.length()) {
            throw r.error("unexpected text after the value");
        }
        return value;
    }

    /** Compact JSON text, members in the map's order. */
    public static String write(Object value) {
        StringBuilder out = new StringBuilder();
        write(value, out, false);
        return out.toString();
    }

    /** RFC 8785 canonical JSON: members sorted by UTF-16 code units, numbers as ECMAScript prints them. */
    public static String canonical(Object value) {
        StringBuilder out = new StringBuilder();
        write(value, out, true);
        return out.toString();
    }

    /** A JSON string literal. */
    public static String quote(String s) {
        StringBuilder out = new StringBuilder(s.length() + 2);
        writeString(s, out);
        return out.toString();
    }

    private static void write(Object v, StringBuilder out, boolean canonical) {
        if (v == null) {
            out.append("null");
        } else if (v instanceof Boolean b) {
            out.append(b ? "true" : "false");
        } else if (v instanceof String s) {
            writeString(s, out);
        } else if (v instanceof BigDecimal d) {
            out.append(canonical ? ecmaNumber(d.doubleValue(), d) : d.toString());
        } else if (v instanceof Integer || v instanceof Long || v instanceof Short || v instanceof Byte) {
            long n = ((Number) v).longValue();
            out.append(canonical ? ecmaNumber((double) n, BigDecimal.valueOf(n)) : Long.toString(n));
        } else if (v instanceof Double || v instanceof Float) {
            double x = ((Number) v).doubleValue();
            out.append(ecmaNumber(x, null));
        } else if (v instanceof Map<?, ?> m) {
            Map<?, ?> members = m;
            if (canonical) {
                TreeMap<String, Object> sorted = new TreeMap<>(); // String order is UTF-16 code unit order
                m.forEach((k, x) -> sorted.put(name(k), x));
                members = sorted;
            }
            out.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> e : members.entrySet()) {
                if (!first) {
                    out.append(',');
                }
                first = false;
                writeString(name(e.getKey()), out);
                out.append(':');
                write(e.getValue(), out, canonical);
            }
            out.append('}');
        } else if (v instanceof List<?> list) {
            out.append('[');
            for (int i = 0; i < list.size(); i++) {
                if (i > 0) {
                    out.append(',');
                }
                write(list.get(i), out, canonical);
            }
            out.append(']');
        } else {
            throw new JsonException("not a JSON value: " + v.getClass().getName());
        }
    }

    private static String name(Object k) {
        if (k instanceof String s) {
            return s;
        }
        throw new JsonException("an object member name is not a string: " + k);
    }

    private static void writeString(String s, StringBuilder out) {
        out.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\b' -> out.append("\\b");
                case '\f' -> out.append("\\f");
                case '\n' -> out.append("\\n");
                case '\r' -> out.append("\\r");
                case '\t' -> out.append("\\t");
                default -> {
                    if (c < 0x20) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
                }
            }
        }
        out.append('"');
    }

    /**
     * A double as ECMAScript's Number.prototype.toString writes it (RFC 8785 section 3.2.2.3):
     * the shortest digits that read back as the same double, the nearest (ties to even) of them.
     */
    static String ecmaNumber(double x, BigDecimal exact) {
        if (Double.isNaN(x) || Double.isInfinite(x)) {
            throw new JsonException("the number " + (exact != null ? exact : x) + " is outside the range of JSON numbers (IEEE 754 double)");
        }
        if (x == 0) {
            return "0";
        }
        BigDecimal value = new BigDecimal(Math.abs(x));
        BigDecimal digits = null;
        for (int p = 1; p <= 17 && digits == null; p++) {
            for (RoundingMode mode : new RoundingMode[] {RoundingMode.HALF_EVEN, RoundingMode.FLOOR, RoundingMode.CEILING}) {
                BigDecimal d = value.round(new MathContext(p, mode));
                if (d.doubleValue() == Math.abs(x)) {
                    digits = d;
                    break;
                }
            }
        }
        if (digits == null) {
            throw new IllegalStateException("no decimal of 17 digits reads back as " + x);
        }
        digits = digits.stripTrailingZeros();
        String s = digits.unscaledValue().toString();
        int k = s.length();
        int n = k - digits.scale(); // x = s × 10^(n − k)
        StringBuilder out = new StringBuilder(x < 0 ? "-" : "");
        if (k <= n && n <= 21) {
            out.append(s).append("0".repeat(n - k));
        } else if (0 < n && n <= 21) {
            out.append(s, 0, n).append('.').append(s, n, k);
        } else if (-6 < n && n <= 0) {
            out.append("0.").append("0".repeat(-n)).append(s);
        } else {
            out.append(s.charAt(0));
            if (k > 1) {
                out.append('.').append(s, 1, k);
            }
            out.append('e').append(n > 0 ? '+' : '-').append(Math.abs(n - 1));
        }
        return out.toString();
    }

    private static final class Reader {
        final String s;
        int pos;

        Reader(String s) {
            this.s = s;
        }

        JsonException error(String what) {
            return new JsonException(what + " at character " + pos);
        }

        void space() {
            while (pos < s.length()) {
                char c = s.charAt(pos);
                if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
                    return;
                }
                pos++;
            }
        }

        Object value(int depth) {
            if (depth >= MAX_DEPTH) {
                throw error("nested deeper than " + MAX_DEPTH);
            }
            if (pos >= s.length()) {
                throw error("unexpected end of the text");
            }
            char c = s.charAt(pos);
            switch (c) {
                case '{':
                    return object(depth);
                case '[':
                    return array(depth);
                case '"':
                    return string();
                case 't':
                    return literal("true", Boolean.TRUE);
                case 'f':
                    return literal("false", Boolean.FALSE);
                case 'n':
                    return literal("null", null);
                default:
                    if (c == '-' || (c >= '0' && c <= '9')) {
                        return number();
                    }
                    throw error("unexpected character '" + c + "'");
            }
        }

        Object literal(String word, Object value) {
            if (!s.startsWith(word, pos)) {
                throw error("invalid literal");
            }
            pos += word.length();
            return value;
        }

        Map<String, Object> object(int depth) {
            Map<String, Object> m = new LinkedHashMap<>();
            pos++;
            space();
            if (peek() == '}') {
                pos++;
                return m;
            }
            while (true) {
                space();
                if (peek() != '"') {
                    throw error("expected a member name");
                }
                String name = string();
                space();
                expect(':');
                space();
                Object v = value(depth + 1);
                m.remove(name); // the last of repeated names wins, in its own place
                m.put(name, v);
                space();
                char c = next();
                if (c == '}') {
                    return m;
                }
                if (c != ',') {
                    pos--;
                    throw error("expected ',' or '}'");
                }
            }
        }

        List<Object> array(int depth) {
            List<Object> list = new ArrayList<>();
            pos++;
            space();
            if (peek() == ']') {
                pos++;
                return list;
            }
            while (true) {
                space();
                list.add(value(depth + 1));
                space();
                char c = next();
                if (c == ']') {
                    return list;
                }
                if (c != ',') {
                    pos--;
                    throw error("expected ',' or ']'");
                }
            }
        }

        String string() {
            pos++; // the opening quote
            StringBuilder out = new StringBuilder();
            while (true) {
                char c = next();
                if (c == '"') {
                    break;
                }
                if (c < 0x20) {
                    pos--;
                    throw error("a control character in a string");
                }
                if (c != '\\') {
                    out.append(c);
                    continue;
                }
                char e = next();
                switch (e) {
                    case '"' -> out.append('"');
                    case '\\' -> out.append('\\');
                    case '/' -> out.append('/');
                    case 'b' -> out.append('\b');
                    case 'f' -> out.append('\f');
                    case 'n' -> out.append('\n');
                    case 'r' -> out.append('\r');
                    case 't' -> out.append('\t');
                    case 'u' -> out.append(hex4());
                    default -> {
                        pos--;
                        throw error("invalid escape");
                    }
                }
            }
            String result = out.toString();
            for (int i = 0; i < result.length(); i++) { // lone surrogates: jsonb refuses them too
                char c = result.charAt(i);
                if (Character.isHighSurrogate(c) && i + 1 < result.length() && Character.isLowSurrogate(result.charAt(i + 1))) {
                    i++;
                } else if (Character.isSurrogate(c)) {
                    throw error("a lone UTF-16 surrogate in a string");
                }
            }
            return result;
        }

        char hex4() {
            if (pos + 4 > s.length()) {
                throw error("unexpected end of the text");
            }
            int v = 0;
            for (int i = 0; i < 4; i++) {
                int d = Character.digit(s.charAt(pos + i), 16);
                if (d < 0) {
                    throw error("invalid \\u escape");
                }
                v = v * 16 + d;
            }
            pos += 4;
            return (char) v;
        }

        BigDecimal number() {
            int start = pos;
            if (peek() == '-') {
                pos++;
            }
            if (peek() == '0') {
                pos++;
            } else if (isDigit(peek())) {
                digits();
            } else {
                throw error("invalid number");
            }
            if (peek() == '.') {
                pos++;
                if (!isDigit(peek())) {
                    throw error("invalid number");
                }
                digits();
            }
            if (peek() == 'e' || peek() == 'E') {
                pos++;
                if (peek() == '+' || peek() == '-') {
                    pos++;
                }
                if (!isDigit(peek())) {
                    throw error("invalid number");
                }
                digits();
            }
            try {
                return new BigDecimal(s.substring(start, pos));
            } catch (NumberFormatException | ArithmeticException e) {
                throw error("number out of range");
            }
        }

        void digits() {
            while (isDigit(peek())) {
                pos++;
            }
        }

        static boolean isDigit(char c) {
            return c >= '0' && c <= '9';
        }

        char peek() {
            return pos < s.length() ? s.charAt(pos) : '\0';
        }

        char next() {
            if (pos >= s.length()) {
                throw error("unexpected end of the text");
            }
            return s.charAt(pos++);
        }

        void expect(char c) {
            if (next() != c) {
                pos--;
                throw error("expected '" + c + "'");
            }
        }
    }
}
