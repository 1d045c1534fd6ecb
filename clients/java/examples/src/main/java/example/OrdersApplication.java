package example;

import dev.pgidempotency.spring.Idempotent;
import java.net.URI;
import java.util.Map;
import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.http.ResponseEntity;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.web.bind.annotation.PostMapping;
import org.springframework.web.bind.annotation.RequestBody;
import org.springframework.web.bind.annotation.RequestHeader;
import org.springframework.web.bind.annotation.RestController;

/**
 * The README's Spring Boot example: POST /orders made idempotent with {@code @Idempotent}, the row
 * written with JdbcTemplate in the claim's transaction.
 *
 * <pre>
 * SPRING_DATASOURCE_URL='jdbc:postgresql://localhost/app?user=app' java -cp ... example.OrdersApplication
 * </pre>
 *
 * The database needs {@code CREATE EXTENSION idempotency}; the app creates its table.
 */
@SpringBootApplication
public class OrdersApplication {
    public static void main(String[] args) {
        SpringApplication app = new SpringApplication(OrdersApplication.class);
        // Whose keys these are (one caller's key never answers another's): the API key; a request
        // without it gets 401. (Or in application.properties: idempotency.tenant-header=X-Api-Key.)
        app.setDefaultProperties(Map.of("idempotency.tenant-header", "X-Api-Key"));
        app.run(args);
    }

    public record OrderIn(String item, int quantity) {}

    public record Order(long id, String item, int quantity) {}

    @RestController
    static class Orders {
        private final JdbcTemplate jdbc;

        Orders(JdbcTemplate jdbc) {
            this.jdbc = jdbc;
            jdbc.execute("CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, tenant text NOT NULL,"
                    + " item text NOT NULL, quantity int NOT NULL)");
        }

        @Idempotent // same transaction: the claim, this row and the stored answer commit together
        @PostMapping("/orders")
        ResponseEntity<Order> create(@RequestBody OrderIn order, @RequestHeader("X-Api-Key") String tenant) {
            if (order.item() == null || order.quantity() <= 0) {
                return ResponseEntity.status(422).build(); // refused: the key stays free
            }
            Long id = jdbc.queryForObject("INSERT INTO orders (tenant, item, quantity) VALUES (?, ?, ?) RETURNING id",
                    Long.class, tenant, order.item(), order.quantity());
            return ResponseEntity.created(URI.create("/orders/" + id)).body(new Order(id, order.item(), order.quantity()));
        }
    }
}
