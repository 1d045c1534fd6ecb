package dev.pgidempotency.http;

import java.util.Map;

/**
 * Thrown by a handler (or a tenant function) to answer with a problem: the request was not carried
 * out, so the claim is rolled back or released, never stored.
 */
public class HttpProblemException extends RuntimeException {
    private static final long serialVersionUID = 1L;
    private final transient HttpAnswer answer;

    public HttpProblemException(int status, String title, String detail) {
        this(Problem.problem(status, "about:blank", title, detail));
    }

    public HttpProblemException(HttpAnswer answer) {
        super(answer.status() + " " + new String(answer.body(), java.nio.charset.StandardCharsets.UTF_8));
        this.answer = answer;
    }

    /** The same problem with one more header line (e.g. WWW-Authenticate). */
    public HttpProblemException withHeader(String name, String value) {
        answer.headers().add(Map.entry(name, value));
        return this;
    }

    public HttpAnswer answer() {
        return answer;
    }
}
