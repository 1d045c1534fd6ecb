package dev.pgidempotency.servlet;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.Test;

class RouteTemplateTest {
    @Test
    void literalAndVariableSegments() {
        RouteTemplate t = RouteTemplate.of("post", "/orders/{id}/pay");
        assertTrue(t.matches("POST", "/orders/42/pay"));
        assertTrue(t.matches("POST", "/orders/42/pay/"));
        assertFalse(t.matches("GET", "/orders/42/pay"));
        assertFalse(t.matches("POST", "/orders//pay"));
        assertFalse(t.matches("POST", "/orders/42"));
        assertFalse(t.matches("POST", "/orders/42/pay/x"));
        assertTrue(RouteTemplate.of("POST", "/").matches("POST", "/"));
        assertFalse(RouteTemplate.of("POST", "/charges").matches("POST", "/charges/external"));
    }

    @Test
    void refusesPatternsItCannotMatch() {
        assertThrows(IllegalArgumentException.class, () -> RouteTemplate.of("POST", "charges"));
        assertThrows(IllegalArgumentException.class, () -> RouteTemplate.of("POST", "/files/**"));
        assertThrows(IllegalArgumentException.class, () -> RouteTemplate.of("POST", "/a/x{id}"));
    }
}
