-- A retry of a pre-populated completed key ('r-<n>') with a different fingerprint (another
-- request body under the same key): answered 422 from one read. Autocommit, one statement.
\set n random(1, :nkeys)
SELECT * FROM peer.claim('acct_42 POST /charges', 'r-' || :n::text, 'sha256:9e1c');
