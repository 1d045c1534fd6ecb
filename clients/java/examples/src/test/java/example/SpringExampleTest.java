package example;

import dev.pgidempotency.DatabaseUrl;
import java.util.Map;

/** OrdersApplication (Spring Boot), started as the README says: SPRING_DATASOURCE_URL, SERVER_PORT. */
class SpringExampleTest extends ExampleAppsTest {
    @Override
    String mainClass() {
        return "example.OrdersApplication";
    }

    @Override
    int portOffset() {
        return 0;
    }

    @Override
    Map<String, String> environment(String postgresUrl, int port) {
        return Map.of("SPRING_DATASOURCE_URL", DatabaseUrl.toJdbc(postgresUrl), "SERVER_PORT", String.valueOf(port),
                "SERVER_ADDRESS", "127.0.0.1");
    }
}
