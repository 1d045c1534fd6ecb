package dev.pgidempotency.spring;

/** The starter's tests against the server itself. */
class StarterDirectTest extends StarterTests {
    @Override
    String database() {
        return "DATABASE_URL";
    }

    @Override
    int portOffset() {
        return 3;
    }
}
