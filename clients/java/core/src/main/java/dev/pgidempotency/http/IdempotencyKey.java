package dev.pgidempotency.http;

import java.util.List;
import java.util.regex.Pattern;

/**
 * The Idempotency-Key request header (contract/contract.json's key_header): exactly one field line
 * holding an RFC 8941 sf-string ({@code "..."}) or, for clients that send it bare, a bare value of
 * token characters (an sf-token, or a bare UUID); 1 to 255 printable ASCII characters after
 * unquoting. Parameters, lists and other item types are refused.
 */
public final class IdempotencyKey {
    public static final int MAX_CHARS = 255;
    private static final Pattern BARE = Pattern.compile("[!#$%&'*+\\-.^_`|~0-9A-Za-z:/]+");

    private IdempotencyKey() {}

    /** Why a request's key was refused: the problem to answer with, and the reason for logs. */
    public static final class Refused extends Exception {
        private static final long serialVersionUID = 1L;
        private final transient Problem problem;

        Refused(Problem problem, String reason) {
            super(reason);
            this.problem = problem;
        }

        public Problem problem() {
            return problem;
        }
    }

    /** @param values the raw values of every Idempotency-Key field line of the request */
    public static String parse(List<String> values) throws Refused {
        if (values.isEmpty()) {
            throw new Refused(Problem.KEY_MISSING, "the request has no Idempotency-Key header");
        }
        if (values.size() > 1) {
            throw new Refused(Problem.KEY_INVALID, "the Idempotency-Key header must appear once");
        }
        String raw = trim(values.get(0));
        String key = raw.startsWith("\"") ? sfString(raw) : bare(raw);
        if (key.isEmpty()) {
            throw invalid("it is empty");
        }
        if (key.length() > MAX_CHARS) {
            throw invalid("it is longer than " + MAX_CHARS + " characters");
        }
        return key;
    }

    private static String trim(String s) {
        int a = 0;
        int b = s.length();
        while (a < b && (s.charAt(a) == ' ' || s.charAt(a) == '\t')) {
            a++;
        }
        while (b > a && (s.charAt(b - 1) == ' ' || s.charAt(b - 1) == '\t')) {
            b--;
        }
        return s.substring(a, b);
    }

    /** RFC 8941 section 4.2.5: DQUOTE *( unescaped / "\" ( DQUOTE / "\" ) ) DQUOTE, nothing after it. */
    private static String sfString(String raw) throws Refused {
        StringBuilder out = new StringBuilder();
        int i = 1;
        while (true) {
            if (i >= raw.length()) {
                throw invalid("the quoted string has no closing quote");
            }
            char c = raw.charAt(i++);
            if (c == '"') {
                break;
            }
            if (c == '\\') {
                if (i >= raw.length()) {
                    throw invalid("the quoted string has no closing quote");
                }
                char e = raw.charAt(i++);
                if (e != '"' && e != '\\') {
                    throw invalid("only \\\" and \\\\ may be escaped");
                }
                out.append(e);
            } else if (c < 0x20 || c > 0x7e) {
                throw invalid("it holds a control or non-ASCII character");
            } else {
                out.append(c);
            }
        }
        if (i != raw.length()) {
            throw invalid("parameters or other text after the quoted string are not accepted");
        }
        return out.toString();
    }

    private static String bare(String raw) throws Refused {
        if (raw.isEmpty()) {
            return raw;
        }
        if (!BARE.matcher(raw).matches()) {
            throw invalid("a bare value must be token characters; send the key quoted (RFC 8941 sf-string)");
        }
        return raw;
    }

    private static Refused invalid(String why) {
        return new Refused(Problem.KEY_INVALID, "the Idempotency-Key is malformed: " + why);
    }
}
