-- Row-level security recipe: binds each tenant's role to the scopes that begin with its
-- own role name and a colon ('tenant_a:POST /charges'). Run it as the owner of the
-- extension's tables (the superuser who created the extension), after
--     CREATE ROLE idem_tenant NOLOGIN;  GRANT idem_tenant TO tenant_a, tenant_b;
--
-- starts_with, not LIKE: in `scope LIKE current_user || ':%'` the '_' of a role name such
-- as tenant_a matches any character, so tenant_a would also get 'tenantXa:...'.
--
-- A policy is bound to its functions and operators when it is created, so nothing on a
-- caller's search_path changes it later. pg_dump does not carry policies (nor ENABLE ROW LEVEL SECURITY)
-- on an extension's tables: run this file again after a restore.
GRANT USAGE ON SCHEMA idempotency TO idem_tenant;
GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency.keys, idempotency.messages TO idem_tenant;

ALTER TABLE idempotency.keys ENABLE ROW LEVEL SECURITY;
ALTER TABLE idempotency.messages ENABLE ROW LEVEL SECURITY;

CREATE POLICY tenant_scope ON idempotency.keys TO idem_tenant
    USING (starts_with(scope, current_user || ':'))
    WITH CHECK (starts_with(scope, current_user || ':'));
CREATE POLICY tenant_scope ON idempotency.messages TO idem_tenant
    USING (starts_with(scope, current_user || ':'))
    WITH CHECK (starts_with(scope, current_user || ':'));
