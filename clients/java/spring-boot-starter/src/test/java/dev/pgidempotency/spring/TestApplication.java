package dev.pgidempotency.spring;

import dev.pgidempotency.servlet.IdempotencyContext;
import dev.pgidempotency.servlet.Mode;
import java.net.URI;
import java.util.Map;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.http.ResponseEntity;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.web.bind.annotation.PathVariable;
import org.springframework.web.bind.annotation.PostMapping;
import org.springframework.web.bind.annotation.RequestBody;
import org.springframework.web.bind.annotation.RequestHeader;
import org.springframework.web.bind.annotation.RestController;

/** The tests' Boot application: controller methods with and without @Idempotent, writing with JdbcTemplate. */
@SpringBootApplication
public class TestApplication {

    /** The request body; a JSON body of another shape is refused by Spring MVC itself (400). */
    public record ItemRequest(int amount, String currency) {}

    @RestController
    static class Items {
        private final JdbcTemplate jdbc;

        Items(JdbcTemplate jdbc) {
            this.jdbc = jdbc;
            jdbc.execute("CREATE TABLE IF NOT EXISTS boot_items (id bigserial PRIMARY KEY, tenant text NOT NULL, amount int)");
        }

        @Idempotent
        @PostMapping("/items")
        ResponseEntity<Map<String, Object>> create(@RequestBody ItemRequest body, @RequestHeader("X-Api-Key") String tenant,
                @RequestHeader(value = "X-Test-Status", required = false) Integer status, IdempotencyContext ctx) {
            Long id = jdbc.queryForObject("INSERT INTO boot_items (tenant, amount) VALUES (?, ?) RETURNING id", Long.class,
                    tenant, body.amount());
            Map<String, Object> out = Map.of("id", id, "amount", body.amount(), "claimed", ctx.outcome().word());
            if (status != null) {
                return ResponseEntity.status(status).body(out);
            }
            return ResponseEntity.created(URI.create("/items/" + id)).body(out);
        }

        @Idempotent(mode = Mode.COMMITTED_FIRST)
        @PostMapping("/orders/{id}/pay")
        ResponseEntity<Map<String, Object>> pay(@PathVariable String id, @RequestBody ItemRequest body,
                @RequestHeader("X-Api-Key") String tenant) {
            Long row = jdbc.queryForObject("INSERT INTO boot_items (tenant, amount) VALUES (?, ?) RETURNING id", Long.class,
                    tenant, body.amount());
            return ResponseEntity.status(201).body(Map.of("order", id, "payment", row));
        }

        @PostMapping("/plain")
        Map<String, Object> plain(@RequestBody ItemRequest body, @RequestHeader("X-Api-Key") String tenant) {
            Long id = jdbc.queryForObject("INSERT INTO boot_items (tenant, amount) VALUES (?, ?) RETURNING id", Long.class,
                    tenant, body.amount());
            return Map.of("id", id);
        }
    }
}
