-- A retry of a pre-populated key ('p-<n>'): answered from one read. Autocommit, one statement.
\set n random(1, :nkeys)
SELECT * FROM peer.claim('acct_42 POST /charges', 'p-' || :n::text, 'sha256:4f2d');
