//! idem_lookup: the live record of (scope, key), read-only, so it also works on a standby.
//! A deferred claim this transaction holds is shown as the record it will write.

use pgrx::heap_tuple::PgHeapTuple;
use pgrx::pg_sys::{TEXTOID, TIMESTAMPTZOID};
use pgrx::prelude::*;
use pgrx::AllocatedByRust;

use crate::api::deferred;
use crate::direct::{self, Table};
use crate::errors::{IdemError, OrRaise};
use crate::spi::{self, get, Kind, Statement};
use crate::validate;

static LOOKUP: Statement = Statement {
    sql: "SELECT k FROM idempotency.keys AS k \
          WHERE k.scope OPERATOR(pg_catalog.=) $1 AND k.key OPERATOR(pg_catalog.=) $2 \
            AND k.expires_at OPERATOR(pg_catalog.>) $3",
    args: &[TEXTOID, TEXTOID, TIMESTAMPTZOID],
    kind: Kind::Read,
    columns: &["k"],
};

// LOOKUP while the table a 0.5.0 database kept its records in is there (same columns).
static LOOKUP_WITH_LEGACY: Statement = Statement {
    sql: "SELECT k FROM idempotency.keys AS k \
          WHERE k.scope OPERATOR(pg_catalog.=) $1 AND k.key OPERATOR(pg_catalog.=) $2 \
            AND k.expires_at OPERATOR(pg_catalog.>) $3 \
          UNION ALL \
          SELECT ROW(l.*)::idempotency.keys FROM idempotency.keys_legacy AS l \
          WHERE l.scope OPERATOR(pg_catalog.=) $1 AND l.key OPERATOR(pg_catalog.=) $2 \
            AND l.expires_at OPERATOR(pg_catalog.>) $3",
    args: &[TEXTOID, TEXTOID, TIMESTAMPTZOID],
    kind: Kind::Read,
    columns: &["k"],
};

#[pg_extern(stable, parallel_restricted)]
fn idem_lookup(
    scope: Option<&str>,
    key: Option<&str>,
) -> SetOfIterator<'static, pgrx::composite_type!('static, "idempotency.keys")> {
    SetOfIterator::new(lookup(scope, key).or_raise())
}

fn lookup(
    scope: Option<&str>,
    key: Option<&str>,
) -> Result<Option<PgHeapTuple<'static, AllocatedByRust>>, IdemError> {
    let scope = validate::key_text("scope", scope)?;
    let key = validate::key_text("key", key)?;
    let now = spi::now();
    if let Some(held) = deferred::held_row(scope, key) {
        return Ok(Some(held));
    }
    Ok(Spi::connect_mut(|client| {
        let lookup = if direct::legacy_exists(Table::Keys) { &LOOKUP_WITH_LEGACY } else { &LOOKUP };
        let found = spi::run(client, lookup, &[scope.into(), key.into(), now.into()]);
        if found.is_empty() {
            None
        } else {
            get(&found.first(), lookup, "k")
        }
    }))
}
