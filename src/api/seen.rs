//! idem_seen: de-duplication for at-least-once message consumers.
//! A duplicate is answered from a read, with nothing written and no transaction id taken.

use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::pg_sys::{TEXTOID, TIMESTAMPTZOID};
use pgrx::prelude::*;

use crate::errors::{IdemError, OrRaise};
use crate::spi::{self, get_not_null, Kind, Statement};
use crate::{settings, validate};

static READ: Statement = Statement {
    sql: "SELECT expires_at FROM idempotency.messages \
          WHERE scope OPERATOR(pg_catalog.=) $1 AND message_id OPERATOR(pg_catalog.=) $2",
    args: &[TEXTOID, TEXTOID],
    kind: Kind::Read,
    columns: &["expires_at"],
};

// $1 scope, $2 message_id, $3 now, $4 expires_at. An expired row counts as never seen.
// Behind another open transaction's insert of the same id this waits on the unique index,
// then touches nothing if that transaction committed.
static RECORD: Statement = Statement {
    sql: "INSERT INTO idempotency.messages AS m (scope, message_id, seen_at, expires_at) \
          VALUES ($1, $2, $3, $4) \
          ON CONFLICT (scope, message_id) DO UPDATE SET seen_at = $3, expires_at = $4 \
          WHERE m.expires_at OPERATOR(pg_catalog.<=) $3",
    args: &[TEXTOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID],
    kind: Kind::Write,
    columns: &[],
};

#[pg_extern(volatile, parallel_unsafe)]
fn idem_seen(scope: Option<&str>, message_id: Option<&str>, ttl: default!(Option<Interval>, "NULL")) -> bool {
    seen(scope, message_id, ttl).or_raise()
}

fn seen(scope: Option<&str>, message_id: Option<&str>, ttl: Option<Interval>) -> Result<bool, IdemError> {
    let scope = validate::key_text("scope", scope)?;
    let message_id = validate::key_text("message_id", message_id)?;
    let ttl = validate::interval_arg("ttl", ttl, settings::default_ttl)?;
    spi::require_primary("idem_seen")?;
    let now = spi::now();
    let expires_at = now + ttl;
    Ok(Spi::connect_mut(|client| {
        let found = spi::run(client, &READ, &[scope.into(), message_id.into()]);
        if !found.is_empty() {
            let live_until: TimestampWithTimeZone = get_not_null(&found.first(), &READ, "expires_at");
            if live_until > now {
                return false;
            }
        }
        spi::run(client, &RECORD, &[scope.into(), message_id.into(), now.into(), expires_at.into()]);
        spi::processed() == 1
    }))
}
