//! idem_seen: de-duplication for at-least-once message consumers.
//! A duplicate is answered from a read, with nothing written and no transaction id taken.
//! idem_seen_many does the same for a batch, in one statement.

use std::collections::HashSet;

use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::pg_sys::{TEXTARRAYOID, TEXTOID, TIMESTAMPTZOID};
use pgrx::prelude::*;
use pgrx::Array;

use crate::direct::{self, Table};
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
    let live = |live_until: TimestampWithTimeZone| live_until > now;
    // Some(found) when the direct read was taken; through SPI, the read and the write share
    // one connection.
    let direct = direct::read(Table::Messages, scope, message_id, READ.columns, |row| {
        row.map(|row| get_not_null::<TimestampWithTimeZone>(row, &READ, "expires_at"))
    });
    if direct.flatten().is_some_and(live) {
        return Ok(false);
    }
    Ok(Spi::connect_mut(|client| {
        if direct.is_none() {
            let found = spi::run(client, &READ, &[scope.into(), message_id.into()]);
            if !found.is_empty() && live(get_not_null(&found.first(), &READ, "expires_at")) {
                return false;
            }
        }
        spi::run(client, &RECORD, &[scope.into(), message_id.into(), now.into(), expires_at.into()]);
        spi::processed() == 1
    }))
}

// $1 scope, $2 the batch's distinct ids in byte order, $3 now, $4 expires_at. Returns the
// ids recorded now: those with no live row (none, or an expired one). One statement that
// looks first and writes only what it did not find, so a batch of duplicates writes nothing
// and takes no transaction id. The look-up is one primary-key lookup per id: a subquery that
// OFFSET 0 keeps from being turned into a join, because a join with the array is planned
// once per backend, and a plan made while the table was small can scan the whole scope and
// test each row against the array, slower with every batch recorded. The rows are inserted
// in the order of $2 (a function scan keeps it): two batches that share ids lock them in the
// same order, so one waits for the other instead of deadlocking. An id that another
// transaction recorded meanwhile is not returned. The conflict arm reads EXCLUDED, not $3 / $4:
// Citus runs it on the shards without the statement's parameters (42P02, 42P18 otherwise).
static RECORD_MANY: Statement = Statement {
    sql: "INSERT INTO idempotency.messages AS m (scope, message_id, seen_at, expires_at) \
          SELECT $1, id, $3, $4 FROM pg_catalog.unnest($2) AS id \
          WHERE NOT EXISTS (SELECT FROM idempotency.messages AS live \
                            WHERE live.scope OPERATOR(pg_catalog.=) $1 \
                              AND live.message_id OPERATOR(pg_catalog.=) id \
                              AND live.expires_at OPERATOR(pg_catalog.>) $3 OFFSET 0) \
          ON CONFLICT (scope, message_id) \
          DO UPDATE SET seen_at = EXCLUDED.seen_at, expires_at = EXCLUDED.expires_at \
          WHERE m.expires_at OPERATOR(pg_catalog.<=) EXCLUDED.seen_at \
          RETURNING m.message_id",
    args: &[TEXTOID, TEXTARRAYOID, TIMESTAMPTZOID, TIMESTAMPTZOID],
    kind: Kind::LookThenWrite,
    columns: &["message_id"],
};

#[pg_extern(volatile, parallel_unsafe)]
fn idem_seen_many(
    scope: Option<&str>,
    message_ids: Option<Array<'_, &str>>,
    ttl: default!(Option<Interval>, "NULL"),
) -> Vec<bool> {
    let ids: Option<Vec<Option<&str>>> = message_ids.as_ref().map(|a| a.iter().collect());
    seen_many(scope, ids, ttl).or_raise()
}

fn seen_many(
    scope: Option<&str>,
    message_ids: Option<Vec<Option<&str>>>,
    ttl: Option<Interval>,
) -> Result<Vec<bool>, IdemError> {
    let scope = validate::key_text("scope", scope)?;
    let ids = validate::message_ids(message_ids)?;
    let ttl = validate::interval_arg("ttl", ttl, settings::default_ttl)?;
    spi::require_primary("idem_seen_many")?;
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let now = spi::now();
    let expires_at = now + ttl;
    let distinct = in_lock_order(&ids);
    let recorded: HashSet<String> = Spi::connect_mut(|client| {
        spi::run(client, &RECORD_MANY, &[scope.into(), distinct.into(), now.into(), expires_at.into()])
            .map(|row| get_not_null::<String>(&row, &RECORD_MANY, "message_id"))
            .collect()
    });
    Ok(first_sightings(&ids, |id| recorded.contains(id)))
}

/// The distinct ids of a batch, in byte order: the order every batch locks them in.
fn in_lock_order<'a>(ids: &[&'a str]) -> Vec<&'a str> {
    let mut distinct = ids.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    distinct
}

/// Element i is true when ids[i] was recorded now and is its first occurrence in the batch.
fn first_sightings(ids: &[&str], recorded: impl Fn(&str) -> bool) -> Vec<bool> {
    let mut seen = HashSet::with_capacity(ids.len());
    ids.iter().map(|&id| seen.insert(id) && recorded(id)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_order_is_sorted_and_distinct() {
        assert_eq!(in_lock_order(&["b", "a", "b", "é", "A"]), ["A", "a", "b", "é"]);
        assert!(in_lock_order(&[]).is_empty());
    }

    #[test]
    fn only_first_occurrences_of_recorded_ids_are_new() {
        let ids = ["m1", "m2", "m1", "m3", "m2"];
        assert_eq!(first_sightings(&ids, |id| id != "m3"), [true, true, false, false, false]);
        assert_eq!(first_sightings(&ids, |_| false), [false; 5]);
        assert!(first_sightings(&[], |_| true).is_empty());
    }
}
