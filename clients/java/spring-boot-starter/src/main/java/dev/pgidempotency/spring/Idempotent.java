package dev.pgidempotency.spring;

import dev.pgidempotency.servlet.Mode;
import java.lang.annotation.Documented;
import java.lang.annotation.ElementType;
import java.lang.annotation.Retention;
import java.lang.annotation.RetentionPolicy;
import java.lang.annotation.Target;

/**
 * Protects a controller method with an Idempotency-Key: the starter's filter claims the key before
 * the method runs and stores its response. The method's mapping (HTTP methods and path templates
 * such as {@code /orders/{id}/pay}) names the scope. In {@link Mode#SAME_TRANSACTION} the
 * application's JdbcTemplate (any data access through Spring's DataSourceUtils) runs inside the
 * claim's transaction.
 */
@Target(ElementType.METHOD)
@Retention(RetentionPolicy.RUNTIME)
@Documented
public @interface Idempotent {
    Mode mode() default Mode.SAME_TRANSACTION;

    /** Top-level JSON members left out of the fingerprint. */
    String[] ignore() default {};

    /** A request without Idempotency-Key gets 400 (false: it runs unprotected). */
    boolean required() default true;

    /** Store 5xx answers (replayed later) instead of giving the key back. */
    boolean storeServerErrors() default false;
}
