package dev.pgidempotency.servlet;

import jakarta.servlet.ServletOutputStream;
import jakarta.servlet.WriteListener;
import jakarta.servlet.http.HttpServletResponse;
import jakarta.servlet.http.HttpServletResponseWrapper;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.OutputStreamWriter;
import java.io.PrintWriter;
import java.nio.charset.Charset;
import java.nio.charset.StandardCharsets;
import java.util.AbstractMap;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/**
 * The handler's response held back until the filter has stored it: the body is buffered here;
 * status and headers go to the wrapped response, which nothing commits meanwhile (flushes are
 * ignored; sendError and sendRedirect only set the status).
 */
final class CapturingResponse extends HttpServletResponseWrapper {
    private final ByteArrayOutputStream body = new ByteArrayOutputStream();
    private ServletOutputStream stream;
    private PrintWriter writer;
    private String errorMessage;

    CapturingResponse(HttpServletResponse response) {
        super(response);
    }

    @Override
    public ServletOutputStream getOutputStream() {
        if (writer != null) {
            throw new IllegalStateException("getWriter() was already called");
        }
        if (stream == null) {
            stream = new ServletOutputStream() {
                @Override
                public void write(int b) {
                    body.write(b);
                }

                @Override
                public void write(byte[] b, int off, int len) {
                    body.write(b, off, len);
                }

                @Override
                public boolean isReady() {
                    return true;
                }

                @Override
                public void setWriteListener(WriteListener listener) {
                    throw new IllegalStateException("the idempotency filter buffers the response: no async writes");
                }
            };
        }
        return stream;
    }

    @Override
    public PrintWriter getWriter() {
        if (stream != null) {
            throw new IllegalStateException("getOutputStream() was already called");
        }
        if (writer == null) {
            String enc = getCharacterEncoding();
            Charset cs = enc == null ? StandardCharsets.ISO_8859_1 : Charset.forName(enc);
            writer = new PrintWriter(new OutputStreamWriter(body, cs));
        }
        return writer;
    }

    @Override
    public void sendError(int sc, String msg) {
        resetBuffer();
        setStatus(sc);
        errorMessage = msg == null ? "" : msg;
    }

    @Override
    public void sendError(int sc) {
        sendError(sc, null);
    }

    @Override
    public void sendRedirect(String location) {
        sendRedirect(location, HttpServletResponse.SC_FOUND, true);
    }

    @Override
    public void sendRedirect(String location, int sc, boolean clearBuffer) {
        if (clearBuffer) {
            resetBuffer();
        }
        setStatus(sc);
        setHeader("Location", location);
    }

    @Override
    public void flushBuffer() {
        if (writer != null) {
            writer.flush();
        }
    }

    @Override
    public boolean isCommitted() {
        return false;
    }

    @Override
    public void resetBuffer() {
        if (writer != null) {
            writer.flush();
        }
        body.reset();
    }

    @Override
    public void reset() {
        resetBuffer();
        super.reset();
        errorMessage = null;
    }

    @Override
    public void setContentLength(int len) {
        // the filter sets the length of what it finally sends
    }

    @Override
    public void setContentLengthLong(long len) {
        // the filter sets the length of what it finally sends
    }

    /** Set when the handler called sendError: the message, for the problem body the filter writes. */
    String errorMessage() {
        return errorMessage;
    }

    byte[] body() {
        if (writer != null) {
            writer.flush();
        }
        return body.toByteArray();
    }

    /** The header lines the handler set, Content-Type included. */
    List<Map.Entry<String, String>> headerLines() {
        HttpServletResponse r = (HttpServletResponse) getResponse();
        List<Map.Entry<String, String>> lines = new ArrayList<>();
        if (r.getContentType() != null) {
            lines.add(new AbstractMap.SimpleEntry<>("Content-Type", r.getContentType()));
        }
        for (String name : r.getHeaderNames()) {
            if (name.equalsIgnoreCase("Content-Type") || name.equalsIgnoreCase("Content-Length")) {
                continue;
            }
            for (String v : r.getHeaders(name)) {
                lines.add(new AbstractMap.SimpleEntry<>(name, v));
            }
        }
        return lines;
    }
}
