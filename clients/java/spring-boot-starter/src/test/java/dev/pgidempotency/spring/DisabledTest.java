package dev.pgidempotency.spring;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import dev.pgidempotency.DatabaseUrl;
import org.junit.jupiter.api.Test;
import org.springframework.boot.WebApplicationType;
import org.springframework.boot.builder.SpringApplicationBuilder;
import org.springframework.context.ConfigurableApplicationContext;

/** The auto-configuration registers its filter, and backs off with idempotency.enabled=false. */
class DisabledTest {
    private static ConfigurableApplicationContext run(String enabled) {
        String url = System.getenv("DATABASE_URL");
        assumeTrue(url != null && !url.isEmpty(), "DATABASE_URL is not set: clients/java/test.sh starts the server");
        return new SpringApplicationBuilder(TestApplication.class).web(WebApplicationType.SERVLET).properties(
                "server.port=" + port(6), "server.address=127.0.0.1", "spring.datasource.url=" + DatabaseUrl.toJdbc(url),
                "spring.main.banner-mode=off", "logging.level.root=warn", "idempotency.enabled=" + enabled).run();
    }

    @Test
    void backsOffWhenDisabled() {
        try (ConfigurableApplicationContext on = run("true")) {
            assertTrue(on.getBeansOfType(IdempotentMethodsFilter.class).size() == 1);
        }
        try (ConfigurableApplicationContext off = run("false")) {
            assertEquals(0, off.getBeansOfType(IdempotentMethodsFilter.class).size());
        }
    }

    /** JAVA_APPS_PORT + offset (clients/java/test.sh sets it; else any free port). */
    private static int port(int offset) {
        String base = System.getenv("JAVA_APPS_PORT");
        return base == null ? 0 : Integer.parseInt(base) + offset;
    }
}
