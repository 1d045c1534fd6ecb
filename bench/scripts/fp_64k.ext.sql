-- idem_fingerprint (RFC 8785 canonical JSON, SHA-256) of one of eight ~64kB documents.
\set d random(101, 108)
SELECT idempotency.idem_fingerprint(doc) FROM bench_docs WHERE id = :d;
