package dev.pgidempotency.servlet;

import dev.pgidempotency.http.StoredResponse;
import java.time.Duration;
import java.util.List;
import java.util.Set;

/**
 * How one route is protected.
 *
 * @param ignore top-level JSON members left out of the fingerprint
 * @param required a request without Idempotency-Key gets 400 (else it runs unprotected)
 * @param ttl how long the stored response is kept (null: the extension's setting)
 * @param lease committed-first: the claim's lease, renewed every third of it
 * @param waitFor committed-first, extension 0.4.0: how long a duplicate waits for the owner before 409
 * @param replayHeaders response headers stored and replayed (Content-Type always is)
 * @param storeServerErrors store 5xx answers (replayed later) instead of giving the key back
 */
public record RouteOptions(Mode mode, Set<String> ignore, boolean required, Duration ttl, Duration lease,
        Duration waitFor, List<String> replayHeaders, boolean storeServerErrors) {

    public static final RouteOptions DEFAULTS = new RouteOptions(Mode.SAME_TRANSACTION, Set.of(), true, null,
            Duration.ofSeconds(30), null, List.of("Location", "Content-Type"), false);

    public RouteOptions {
        ignore = Set.copyOf(ignore);
        replayHeaders = List.copyOf(replayHeaders);
        if (lease == null || lease.toMillis() < 3) {
            throw new IllegalArgumentException("lease must be given (it sets the renewal period, a third of it)");
        }
    }

    public RouteOptions withMode(Mode v) {
        return new RouteOptions(v, ignore, required, ttl, lease, waitFor, replayHeaders, storeServerErrors);
    }

    public RouteOptions withIgnore(Set<String> v) {
        return new RouteOptions(mode, v, required, ttl, lease, waitFor, replayHeaders, storeServerErrors);
    }

    public RouteOptions withRequired(boolean v) {
        return new RouteOptions(mode, ignore, v, ttl, lease, waitFor, replayHeaders, storeServerErrors);
    }

    public RouteOptions withTtl(Duration v) {
        return new RouteOptions(mode, ignore, required, v, lease, waitFor, replayHeaders, storeServerErrors);
    }

    public RouteOptions withLease(Duration v) {
        return new RouteOptions(mode, ignore, required, ttl, v, waitFor, replayHeaders, storeServerErrors);
    }

    public RouteOptions withWaitFor(Duration v) {
        return new RouteOptions(mode, ignore, required, ttl, lease, v, replayHeaders, storeServerErrors);
    }

    public RouteOptions withReplayHeaders(List<String> v) {
        return new RouteOptions(mode, ignore, required, ttl, lease, waitFor, v, storeServerErrors);
    }

    public RouteOptions withStoreServerErrors(boolean v) {
        return new RouteOptions(mode, ignore, required, ttl, lease, waitFor, replayHeaders, v);
    }

    /** Whether an answer with this status is stored (else the key is given back). */
    boolean stores(int status) {
        if (status >= 500) {
            return storeServerErrors;
        }
        return !StoredResponse.REFUSED_STATUSES.contains(status);
    }
}
