-- The hand-written fingerprint: sha256 of the jsonb's text form, of one of eight ~64kB documents.
\set d random(101, 108)
SELECT peer.fingerprint(doc) FROM bench_docs WHERE id = :d;
