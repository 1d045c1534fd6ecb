package dev.pgidempotency.spring;

/** The starter's tests through PgBouncer in transaction pooling mode. */
class StarterThroughPgBouncerTest extends StarterTests {
    @Override
    String database() {
        return "PGBOUNCER_URL";
    }

    @Override
    int portOffset() {
        return 4;
    }
}
