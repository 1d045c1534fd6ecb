package dev.pgidempotency.servlet;

/** The filter's HTTP tests against the server itself. */
class DirectTest extends FilterHttpTests {
    @Override
    String database() {
        return "DATABASE_URL";
    }

    @Override
    int portOffset() {
        return 0;
    }
}
