package dev.pgidempotency;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import org.junit.jupiter.api.Test;

class DatabaseUrlTest {
    @Test
    void libpqUrlsBecomePgjdbcUrlsWithoutServerSidePreparedStatements() {
        assertEquals("jdbc:postgresql://db.example:5432/postgres?user=postgres&prepareThreshold=0",
                DatabaseUrl.toJdbc("postgresql://postgres@db.example:5432/postgres"));
        assertEquals("jdbc:postgresql://db/app?user=a%40b&password=p%3Aw&sslmode=require&prepareThreshold=0",
                DatabaseUrl.toJdbc("postgres://a%40b:p%3Aw@db/app?sslmode=require"));
        assertEquals("jdbc:postgresql://h/postgres?prepareThreshold=5", DatabaseUrl.toJdbc("postgresql://h?prepareThreshold=5"));
        assertEquals("jdbc:postgresql://h/x", DatabaseUrl.toJdbc("jdbc:postgresql://h/x"));
        assertThrows(IllegalArgumentException.class, () -> DatabaseUrl.toJdbc("mysql://h/x"));
    }
}
