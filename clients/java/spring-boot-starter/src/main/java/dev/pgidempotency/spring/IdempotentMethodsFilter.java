package dev.pgidempotency.spring;

import dev.pgidempotency.http.HttpProblemException;
import dev.pgidempotency.servlet.IdempotencyFilter;
import dev.pgidempotency.servlet.RouteOptions;
import jakarta.servlet.Filter;
import jakarta.servlet.FilterChain;
import jakarta.servlet.ServletException;
import jakarta.servlet.ServletRequest;
import jakarta.servlet.ServletResponse;
import java.io.IOException;
import java.util.Map;
import java.util.Set;
import javax.sql.DataSource;
import org.springframework.beans.factory.SmartInitializingSingleton;
import org.springframework.core.Ordered;
import org.springframework.jdbc.datasource.ConnectionHolder;
import org.springframework.transaction.support.TransactionSynchronizationManager;
import org.springframework.web.bind.annotation.RequestMethod;
import org.springframework.web.method.HandlerMethod;
import org.springframework.web.servlet.mvc.method.RequestMappingInfo;
import org.springframework.web.servlet.mvc.method.annotation.RequestMappingHandlerMapping;

/**
 * The servlet filter the starter registers: an {@link IdempotencyFilter} whose routes are the
 * {@link Idempotent} controller methods, read from Spring MVC's handler mappings once every
 * controller is mapped (so a method it cannot protect stops the application at start-up).
 */
final class IdempotentMethodsFilter implements Filter, Ordered, SmartInitializingSingleton {
    private final DataSource dataSource;
    private final IdempotencyProperties properties;
    private final RequestMappingHandlerMapping mappings;
    private final IdempotencyFilter.Tenant tenant;
    private volatile IdempotencyFilter delegate;

    IdempotentMethodsFilter(DataSource dataSource, IdempotencyProperties properties, RequestMappingHandlerMapping mappings,
            IdempotencyFilter.Tenant tenant) {
        this.dataSource = dataSource;
        this.properties = properties;
        this.mappings = mappings;
        this.tenant = tenant;
    }

    @Override
    public int getOrder() {
        return properties.getFilterOrder();
    }

    @Override
    public void afterSingletonsInstantiated() {
        delegate();
    }

    @Override
    public void doFilter(ServletRequest request, ServletResponse response, FilterChain chain)
            throws IOException, ServletException {
        delegate().doFilter(request, response, chain);
    }

    @Override
    public void destroy() {
        if (delegate != null) {
            delegate.destroy();
        }
    }

    private IdempotencyFilter delegate() {
        IdempotencyFilter d = delegate;
        if (d == null) {
            synchronized (this) {
                d = delegate;
                if (d == null) {
                    d = build();
                    delegate = d;
                }
            }
        }
        return d;
    }

    /** One route per HTTP method and path pattern of every @Idempotent handler method. */
    IdempotencyFilter build() {
        IdempotencyFilter.Builder b = IdempotencyFilter.builder(dataSource)
                .tenant(tenant)
                .connectionTimeout(properties.getConnectionTimeout())
                // Same transaction: Spring's DataSourceUtils (JdbcTemplate...) hands out the claim's connection.
                .transactionBinding(connection -> {
                    TransactionSynchronizationManager.bindResource(dataSource, new ConnectionHolder(connection));
                    return () -> TransactionSynchronizationManager.unbindResource(dataSource);
                });
        for (Map.Entry<RequestMappingInfo, HandlerMethod> e : mappings.getHandlerMethods().entrySet()) {
            Idempotent a = e.getValue().getMethodAnnotation(Idempotent.class);
            if (a == null) {
                continue;
            }
            Set<RequestMethod> methods = e.getKey().getMethodsCondition().getMethods();
            if (methods.isEmpty()) {
                throw new IllegalStateException("@Idempotent " + e.getValue() + " must name its HTTP method (@PostMapping...)");
            }
            RouteOptions o = RouteOptions.DEFAULTS.withMode(a.mode()).withIgnore(Set.of(a.ignore()))
                    .withRequired(a.required()).withStoreServerErrors(a.storeServerErrors())
                    .withLease(properties.getLease()).withTtl(properties.getTtl()).withWaitFor(properties.getWaitFor())
                    .withReplayHeaders(properties.getReplayHeaders());
            for (RequestMethod m : methods) {
                for (String pattern : e.getKey().getPatternValues()) {
                    b.route(m.name(), pattern, o);
                }
            }
        }
        return b.build();
    }

    /** The tenant from the configured header; missing: 401 before anything is claimed. */
    static IdempotencyFilter.Tenant headerTenant(String header) {
        if (header == null || header.isEmpty()) {
            return request -> null;
        }
        return request -> {
            String v = request.getHeader(header);
            if (v == null || v.isEmpty()) {
                throw new HttpProblemException(401, "Unauthorized", "This request requires the " + header + " header.");
            }
            return v;
        };
    }
}
