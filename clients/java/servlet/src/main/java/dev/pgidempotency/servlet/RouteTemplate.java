package dev.pgidempotency.servlet;

import java.util.Arrays;

/**
 * A route's path template, {@code /charges/{id}}: literal segments and {@code {name}} variables
 * (one whole segment each). The scope names the template, not the path.
 */
record RouteTemplate(String method, String template, String[] segments) {

    static RouteTemplate of(String method, String template) {
        if (!template.startsWith("/")) {
            throw new IllegalArgumentException("a route template starts with '/': " + template);
        }
        String[] segments = split(template);
        for (String s : segments) {
            boolean variable = s.startsWith("{") && s.endsWith("}") && s.length() > 2;
            if (!variable && (s.contains("{") || s.contains("}") || s.contains("*"))) {
                throw new IllegalArgumentException("only literal segments and {name} segments are supported: " + template);
            }
        }
        return new RouteTemplate(method.toUpperCase(java.util.Locale.ROOT), template, segments);
    }

    boolean matches(String requestMethod, String path) {
        if (!method.equals(requestMethod)) {
            return false;
        }
        String[] parts = split(path);
        if (parts.length != segments.length) {
            return false;
        }
        for (int i = 0; i < parts.length; i++) {
            boolean variable = segments[i].startsWith("{");
            if (variable ? parts[i].isEmpty() : !segments[i].equals(parts[i])) {
                return false;
            }
        }
        return true;
    }

    private static String[] split(String path) {
        String p = path.endsWith("/") && path.length() > 1 ? path.substring(0, path.length() - 1) : path;
        return p.equals("/") ? new String[0] : Arrays.copyOfRange(p.split("/", -1), 1, p.split("/", -1).length);
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof RouteTemplate r && r.method.equals(method) && r.template.equals(template);
    }

    @Override
    public int hashCode() {
        return method.hashCode() * 31 + template.hashCode();
    }

    @Override
    public String toString() {
        return method + " " + template;
    }
}
