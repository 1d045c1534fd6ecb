package example;

import java.util.Map;

/** OrdersServer (embedded Tomcat, no framework), started as the README says: DATABASE_URL, PORT. */
class ServletExampleTest extends ExampleAppsTest {
    @Override
    String mainClass() {
        return "example.OrdersServer";
    }

    @Override
    int portOffset() {
        return 1;
    }

    @Override
    Map<String, String> environment(String postgresUrl, int port) {
        return Map.of("DATABASE_URL", postgresUrl, "PORT", String.valueOf(port));
    }
}
