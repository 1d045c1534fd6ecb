package dev.pgidempotency.servlet;

/** The filter's HTTP tests through PgBouncer in transaction pooling mode. */
class ThroughPgBouncerTest extends FilterHttpTests {
    @Override
    String database() {
        return "PGBOUNCER_URL";
    }

    @Override
    int portOffset() {
        return 1;
    }
}
