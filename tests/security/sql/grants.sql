-- The privilege recipe of docs/security.md for an application role (psql variable :role).
-- Functions are SECURITY INVOKER and EXECUTE stays with PUBLIC: what a role may do with
-- the API is exactly what it may do with these tables.
GRANT USAGE ON SCHEMA idempotency TO :"role";
GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency.keys, idempotency.messages TO :"role";
GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency.outbound, idempotency.outbound_budget TO :"role";
