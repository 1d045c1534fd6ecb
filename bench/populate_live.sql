-- Adds records (scope, key) numbered :from .. :to to idempotency.keys, the way
-- INSERT ... SELECT generate_series makes them quickly: completed, keys like uuids (so they
-- land all over the primary key), expires_at spread over the next 24 hours (live), or over
-- the last hour when :expired is 1. psql -v from=1 -v to=1000000 -v expired=0
INSERT INTO idempotency.keys
    (scope, key, fingerprint, status, token, attempts, locked_until, response_status,
     response_headers, response_body, created_at, updated_at, completed_at, expires_at)
SELECT 'acct_' || (i % 100) || ' POST /orders',
       md5(i::text)::uuid::text,
       'sha256:' || md5(i::text) || md5(i::text || 'x'),
       'completed', gen_random_uuid(), 1, NULL, 201,
       '{"Location": "/orders/ord_1"}'::jsonb,
       jsonb_build_object('id', 'ord_' || i, 'amount', i % 1000, 'currency', 'usd'),
       now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour',
       CASE WHEN :expired = 1 THEN now() - interval '1 second' - (i % 3600) * interval '1 second'
            ELSE now() + interval '1 hour' + (i % 82800) * interval '1 second' END
  FROM generate_series(:from::bigint, :to::bigint) AS i;
