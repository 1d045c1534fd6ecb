-- The hand-written fingerprint: sha256 of the jsonb's text form, of one of eight ~1kB documents.
\set d random(1, 8)
SELECT peer.fingerprint(doc) FROM bench_docs WHERE id = :d;
