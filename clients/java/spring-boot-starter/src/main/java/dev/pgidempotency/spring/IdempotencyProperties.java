package dev.pgidempotency.spring;

import dev.pgidempotency.servlet.IdempotencyFilter;
import java.time.Duration;
import java.util.List;
import org.springframework.boot.context.properties.ConfigurationProperties;

/** {@code idempotency.*} settings of the starter. */
@ConfigurationProperties("idempotency")
public class IdempotencyProperties {
    /** Whether the starter protects the {@code @Idempotent} methods. */
    private boolean enabled = true;
    /** Committed-first claims' lease, renewed every third of it while the method runs. */
    private Duration lease = Duration.ofSeconds(30);
    /** How long stored responses are kept (unset: the extension's idempotency.default_ttl). */
    private Duration ttl;
    /** Committed-first, extension 0.4.0: how long a duplicate waits for the owner before answering 409. */
    private Duration waitFor;
    /** The request header naming the tenant (the scope's prefix); a request without it gets 401. Unset: no tenant. */
    private String tenantHeader;
    /** Response headers stored and replayed (Content-Type always is). */
    private List<String> replayHeaders = List.of("Location", "Content-Type");
    /** The filter's order among the servlet filters. */
    private int filterOrder = 0;
    /** How long a request waits for a connection of the DataSource, whatever the pool's timeout; then 503. */
    private Duration connectionTimeout = IdempotencyFilter.DEFAULT_CONNECTION_TIMEOUT;

    public boolean isEnabled() {
        return enabled;
    }

    public void setEnabled(boolean enabled) {
        this.enabled = enabled;
    }

    public Duration getLease() {
        return lease;
    }

    public void setLease(Duration lease) {
        this.lease = lease;
    }

    public Duration getTtl() {
        return ttl;
    }

    public void setTtl(Duration ttl) {
        this.ttl = ttl;
    }

    public Duration getWaitFor() {
        return waitFor;
    }

    public void setWaitFor(Duration waitFor) {
        this.waitFor = waitFor;
    }

    public String getTenantHeader() {
        return tenantHeader;
    }

    public void setTenantHeader(String tenantHeader) {
        this.tenantHeader = tenantHeader;
    }

    public List<String> getReplayHeaders() {
        return replayHeaders;
    }

    public void setReplayHeaders(List<String> replayHeaders) {
        this.replayHeaders = replayHeaders;
    }

    public int getFilterOrder() {
        return filterOrder;
    }

    public void setFilterOrder(int filterOrder) {
        this.filterOrder = filterOrder;
    }

    public Duration getConnectionTimeout() {
        return connectionTimeout;
    }

    public void setConnectionTimeout(Duration connectionTimeout) {
        this.connectionTimeout = connectionTimeout;
    }
}
