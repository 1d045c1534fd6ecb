//! `idempotency`: idempotency keys, leases and message de-duplication inside the caller's
//! own PostgreSQL transaction. The SQL contract is in docs/reference.md.
//!
//! Layers, each using only the ones below it (and, inside the glue, `spi`):
//! - `api`: what SQL sees, one module per group of functions;
//! - `spi`, `direct`, `jsonb`, `settings`, `deployment`, `wakeup`, `keylock`: the glue to the
//!   server (statements, the direct read of a record by its primary key, datums, settings,
//!   where the tables live, waking the claims that wait, the lock that holds a key);
//! - `jcs`, `validate`, `record`, `errors`, `sending`, `budget_ledger`: pure rules, tested with a plain `cargo test`.

use pgrx::prelude::*;

// First: its macros (the partition key's spelling) serve the statements of `api`.
#[macro_use]
mod layout;
mod api;
mod budget_ledger;
mod deployment;
mod direct;
mod errors;
mod jcs;
mod jsonb;
mod keylock;
mod policy;
mod record;
mod sending;
mod settings;
mod spi;
mod validate;
mod wakeup;

#[cfg(test)]
mod fuzz_tests;
#[cfg(any(test, feature = "pg_test"))]
mod test_json;
#[cfg(any(test, feature = "pg_test"))]
mod test_rng;
// In-process tests need a server: `cargo pgrx test` turns them on; plain `cargo test` runs the pure ones.
#[cfg(feature = "pg_test")]
mod tests;

::pgrx::pg_module_magic!(name, version);

extension_sql_file!("../sql/bootstrap.sql", name = "bootstrap", bootstrap);
extension_sql_file!("../sql/finalize.sql", name = "finalize", finalize);
extension_sql_file!("../sql/send.sql", name = "send", requires = [idem_fingerprint]);
extension_sql_file!("../sql/partitions.sql", name = "partitions");
extension_sql_file!(
    "../sql/citus.sql",
    name = "citus",
    requires = [
        idem_scope_support,
        idem_claim_deferred,
        idem_complete,
        idem_checkpoint,
        idem_release,
        idem_lookup,
        idem_seen,
        idem_seen_many
    ]
);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    settings::register();
}

/// Required by `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
