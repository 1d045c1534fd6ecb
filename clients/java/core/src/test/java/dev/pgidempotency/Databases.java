package dev.pgidempotency;

import static org.junit.jupiter.api.Assumptions.assumeTrue;

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.SQLException;
import java.util.stream.Stream;
import org.junit.jupiter.params.provider.Arguments;

/**
 * The databases the tests run against, from the environment clients/java/test.sh sets: the server
 * itself (DATABASE_URL) and PgBouncer in transaction pooling mode in front of it (PGBOUNCER_URL).
 * Without them the tests are skipped (and test.sh lists them), never passed.
 */
public final class Databases {
    private Databases() {}

    public static String url(String name) {
        String url = System.getenv(name);
        assumeTrue(url != null && !url.isEmpty(), name + " is not set: clients/java/test.sh starts the server and PgBouncer");
        return DatabaseUrl.toJdbc(url);
    }

    public static Connection connect(String name) throws SQLException {
        return DriverManager.getConnection(url(name));
    }

    /** For @MethodSource: the server and PgBouncer. */
    public static Stream<Arguments> both() {
        return Stream.of(Arguments.of("DATABASE_URL"), Arguments.of("PGBOUNCER_URL"));
    }
}
