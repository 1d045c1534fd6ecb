package dev.pgidempotency;

import java.net.URI;
import java.net.URLDecoder;
import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.Map;

/** libpq-style database URLs ({@code postgresql://user:password@host:port/db?options}) for pgjdbc. */
public final class DatabaseUrl {
    private DatabaseUrl() {}

    /**
     * The pgjdbc URL for a libpq-style URL: user and password become parameters, the query's
     * options are kept, and {@code prepareThreshold=0} is added unless given: pgjdbc then makes no
     * server-side prepared statements, which PgBouncer in transaction pooling mode would hand to
     * other clients' sessions. A {@code jdbc:} URL is returned unchanged.
     */
    public static String toJdbc(String url) {
        if (url.startsWith("jdbc:")) {
            return url;
        }
        URI u = URI.create(url);
        if (!"postgresql".equals(u.getScheme()) && !"postgres".equals(u.getScheme())) {
            throw new IllegalArgumentException("expected a postgresql:// URL, got " + url);
        }
        Map<String, String> params = new LinkedHashMap<>();
        if (u.getRawUserInfo() != null) {
            String[] up = u.getRawUserInfo().split(":", 2);
            params.put("user", URLDecoder.decode(up[0], StandardCharsets.UTF_8));
            if (up.length > 1) {
                params.put("password", URLDecoder.decode(up[1], StandardCharsets.UTF_8));
            }
        }
        if (u.getRawQuery() != null) {
            for (String kv : u.getRawQuery().split("&")) {
                String[] p = kv.split("=", 2);
                params.put(URLDecoder.decode(p[0], StandardCharsets.UTF_8),
                        p.length > 1 ? URLDecoder.decode(p[1], StandardCharsets.UTF_8) : "");
            }
        }
        params.putIfAbsent("prepareThreshold", "0");
        String db = u.getRawPath() == null || u.getRawPath().length() <= 1 ? "postgres" : u.getRawPath().substring(1);
        StringBuilder out = new StringBuilder("jdbc:postgresql://")
                .append(u.getHost() == null ? "localhost" : u.getHost())
                .append(u.getPort() > 0 ? ":" + u.getPort() : "")
                .append('/').append(db);
        char sep = '?';
        for (Map.Entry<String, String> p : params.entrySet()) {
            out.append(sep).append(URLEncoder.encode(p.getKey(), StandardCharsets.UTF_8)).append('=')
                    .append(URLEncoder.encode(p.getValue(), StandardCharsets.UTF_8));
            sep = '&';
        }
        return out.toString();
    }
}
