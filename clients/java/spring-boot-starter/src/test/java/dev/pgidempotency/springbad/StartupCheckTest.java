package dev.pgidempotency.springbad;

import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import dev.pgidempotency.DatabaseUrl;
import dev.pgidempotency.spring.Idempotent;
import org.junit.jupiter.api.Test;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.boot.builder.SpringApplicationBuilder;
import org.springframework.web.bind.annotation.RequestMapping;
import org.springframework.web.bind.annotation.RestController;

/** An @Idempotent method the filter cannot protect stops the application at start-up, with the reason. */
class StartupCheckTest {
    @SpringBootApplication
    static class BadApplication {
        @RestController
        static class AnyMethod {
            @Idempotent
            @RequestMapping("/anything")
            String anything() {
                return "";
            }
        }
    }

    @Test
    void anIdempotentMethodWithoutAnHttpMethodFailsTheStart() {
        String url = System.getenv("DATABASE_URL");
        assumeTrue(url != null && !url.isEmpty(), "DATABASE_URL is not set: clients/java/test.sh starts the server");
        Exception e = assertThrows(Exception.class, () -> new SpringApplicationBuilder(BadApplication.class).properties(
                "server.port=" + port(7), "server.address=127.0.0.1", "spring.datasource.url=" + DatabaseUrl.toJdbc(url),
                "spring.main.banner-mode=off", "logging.level.root=off").run().close());
        boolean named = false;
        for (Throwable t = e; t != null; t = t.getCause()) {
            named |= String.valueOf(t.getMessage()).contains("must name its HTTP method");
        }
        assertTrue(named, e.toString());
    }

    /** JAVA_APPS_PORT + offset (clients/java/test.sh sets it; else any free port). */
    private static int port(int offset) {
        String base = System.getenv("JAVA_APPS_PORT");
        return base == null ? 0 : Integer.parseInt(base) + offset;
    }
}
