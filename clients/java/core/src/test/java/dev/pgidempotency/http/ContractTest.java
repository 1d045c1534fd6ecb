package dev.pgidempotency.http;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.pgidempotency.Json;
import dev.pgidempotency.Outcome;
import java.io.IOException;
import java.math.BigDecimal;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.EnumSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** The package's problem map against the one description of the HTTP mapping, contract/contract.json. */
class ContractTest {
    private static Map<?, ?> contract;

    @BeforeAll
    static void read() throws IOException {
        Path file = Path.of(System.getProperty("idem.repo.root", "../../.."), "contract", "contract.json");
        contract = (Map<?, ?>) Json.parse(Files.readAllBytes(file));
    }

    private static Problem bySlug(String slug) {
        for (Problem p : Problem.values()) {
            if (p.slug().equals(slug)) {
                return p;
            }
        }
        return null;
    }

    @Test
    void problemTypePrefix() {
        assertEquals(contract.get("problem_type_prefix"), Problem.TYPE_PREFIX);
    }

    @Test
    void everyProblemOfTheContractWithItsStatusTitleDetailAndHeaders() {
        Set<Problem> seen = EnumSet.noneOf(Problem.class);
        for (Object o : (List<?>) contract.get("problems")) {
            Map<?, ?> c = (Map<?, ?>) o;
            String slug = (String) c.get("slug");
            Problem p = bySlug(slug);
            assertNotNull(p, "the package has no problem " + slug);
            seen.add(p);
            assertEquals(((BigDecimal) c.get("status")).intValueExact(), p.status(), slug + ": status");
            assertEquals(c.get("title"), p.title(), slug + ": title");
            assertEquals(c.get("detail"), p.detail(), slug + ": detail");
            List<?> headers = c.get("headers") == null ? List.of() : (List<?>) c.get("headers");
            assertEquals(headers.contains("Retry-After"), p.retryAfter(), slug + ": Retry-After");
            HttpAnswer a = p.answer(7);
            assertEquals(p.status(), a.status());
            assertEquals(Problem.CONTENT_TYPE, a.header("Content-Type"));
            Map<?, ?> body = (Map<?, ?>) Json.parse(a.body());
            assertEquals(Problem.TYPE_PREFIX + slug, body.get("type"));
            assertEquals(c.get("status"), body.get("status"));
            assertEquals(p.retryAfter() ? "7" : null, a.header("Retry-After"));
        }
        assertEquals(EnumSet.allOf(Problem.class), seen, "problems the contract does not list");
    }

    @Test
    void everyOutcomeAnswersAsTheContractSays() {
        Set<Outcome> seen = EnumSet.noneOf(Outcome.class);
        for (Object o : (List<?>) contract.get("outcomes")) {
            Map<?, ?> c = (Map<?, ?>) o;
            Outcome outcome = Outcome.of((String) c.get("outcome"));
            seen.add(outcome);
            Problem p = Problem.forOutcome(outcome);
            Object status = c.get("http_status");
            if (c.get("problem") == null) {
                assertNull(p, outcome + " answers no problem");
                assertTrue(status == null || status.equals("stored"), outcome + ": " + status);
                assertEquals(status == null, outcome.owns(), outcome + " runs the handler");
            } else {
                assertNotNull(p, outcome + " answers a problem");
                assertEquals(c.get("problem"), p.slug(), outcome + ": problem");
                assertEquals(((BigDecimal) status).intValueExact(), p.status(), outcome + ": status");
            }
        }
        assertEquals(EnumSet.allOf(Outcome.class), seen, "outcomes the contract does not list");
    }

    @Test
    void refusedStatusesAreTheContracts() {
        Set<Integer> statuses = new java.util.TreeSet<>();
        for (Object s : (List<?>) ((Map<?, ?>) contract.get("refused_statuses")).get("statuses")) {
            statuses.add(((BigDecimal) s).intValueExact());
        }
        assertEquals(statuses, new java.util.TreeSet<>(StoredResponse.REFUSED_STATUSES));
    }

    @Test
    void theKeyHeader() {
        Map<?, ?> k = (Map<?, ?>) contract.get("key_header");
        assertEquals(k.get("name"), "Idempotency-Key");
        assertEquals(((BigDecimal) k.get("max_chars")).intValueExact(), IdempotencyKey.MAX_CHARS);
    }
}
