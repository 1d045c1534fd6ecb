//! idem_seen: de-duplication for at-least-once message consumers.
//! A duplicate is answered from a read, with nothing written and no transaction id taken.
//! idem_seen_many does the same for a batch.
//!
//! A message id seen for the first time is recorded under its lock (src/keylock.rs, the
//! space of message ids), after a second read under the latest snapshot: messages are kept
//! in time partitions (0.6.0), so two first sightings of one id could otherwise go to two
//! partitions. A delivery that waited for another transaction's sighting of the id answers
//! false once that one committed. A batch locks its new ids in byte order, so two batches
//! that share ids wait instead of deadlocking; it holds one lock per new id until its
//! transaction ends (docs/operations.md says how many the lock table holds).

use std::collections::HashSet;

use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::pg_sys::{self, TEXTARRAYOID, TEXTOID, TIMESTAMPTZOID};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;
use pgrx::Array;

use crate::direct::{self, Table};
use crate::errors::{IdemError, OrRaise};
use crate::keylock::{self, Space};
use crate::spi::{self, get_not_null, Kind, Statement};
use crate::{policy, settings, validate};

// The id's latest record (a partition about to be dropped may still hold an older one).
static READ: Statement = Statement {
    sql: "SELECT expires_at FROM idempotency.messages \
          WHERE scope OPERATOR(pg_catalog.=) $1 AND message_id OPERATOR(pg_catalog.=) $2 \
          ORDER BY expires_at DESC LIMIT 1",
    args: &[TEXTOID, TEXTOID],
    kind: Kind::Read,
    columns: &["expires_at"],
};

static READ_WITH_LEGACY: Statement = Statement {
    sql: "SELECT expires_at FROM (\
            SELECT expires_at FROM idempotency.messages \
             WHERE scope OPERATOR(pg_catalog.=) $1 AND message_id OPERATOR(pg_catalog.=) $2 \
            UNION ALL \
            SELECT expires_at FROM idempotency.messages_legacy \
             WHERE scope OPERATOR(pg_catalog.=) $1 AND message_id OPERATOR(pg_catalog.=) $2) AS r \
          ORDER BY expires_at DESC LIMIT 1",
    args: &[TEXTOID, TEXTOID],
    kind: Kind::Read,
    columns: &["expires_at"],
};

// $1 scope, $2 ids: each id of the batch with the latest expiry of its records (NULL: none).
// One primary-key look-up per id (per partition): a scalar subquery, because a join with the
// array (or `= ANY ($2)`) is planned once per backend, and a plan made while the table was
// small can read the whole scope and test each row against the array, slower with every
// batch recorded.
static LATEST: Statement = Statement {
    sql: "SELECT id AS message_id, \
                 (SELECT pg_catalog.max(m.expires_at) FROM idempotency.messages AS m \
                   WHERE m.scope OPERATOR(pg_catalog.=) $1 AND m.message_id OPERATOR(pg_catalog.=) id) AS latest \
          FROM pg_catalog.unnest($2) AS id",
    args: &[TEXTOID, TEXTARRAYOID],
    kind: Kind::Read,
    columns: &["message_id", "latest"],
};

static LATEST_WITH_LEGACY: Statement = Statement {
    sql: "SELECT id AS message_id, \
                 pg_catalog.greatest( \
                   (SELECT pg_catalog.max(m.expires_at) FROM idempotency.messages AS m \
                     WHERE m.scope OPERATOR(pg_catalog.=) $1 AND m.message_id OPERATOR(pg_catalog.=) id), \
                   (SELECT pg_catalog.max(l.expires_at) FROM idempotency.messages_legacy AS l \
                     WHERE l.scope OPERATOR(pg_catalog.=) $1 AND l.message_id OPERATOR(pg_catalog.=) id)) AS latest \
          FROM pg_catalog.unnest($2) AS id",
    args: &[TEXTOID, TEXTARRAYOID],
    kind: Kind::Read,
    columns: &["message_id", "latest"],
};

// $1 scope, $2 ids, $3 now: the expired records of ids about to be recorded, wherever they are.
static DELETE_EXPIRED: Statement = Statement {
    sql: "DELETE FROM idempotency.messages \
          WHERE scope OPERATOR(pg_catalog.=) $1 AND message_id OPERATOR(pg_catalog.=) ANY ($2) \
            AND expires_at OPERATOR(pg_catalog.<=) $3",
    args: &[TEXTOID, TEXTARRAYOID, TIMESTAMPTZOID],
    kind: Kind::Write,
    columns: &[],
};

static DELETE_EXPIRED_LEGACY: Statement = Statement {
    sql: "DELETE FROM idempotency.messages_legacy \
          WHERE scope OPERATOR(pg_catalog.=) $1 AND message_id OPERATOR(pg_catalog.=) ANY ($2) \
            AND expires_at OPERATOR(pg_catalog.<=) $3",
    args: &[TEXTOID, TEXTARRAYOID, TIMESTAMPTZOID],
    kind: Kind::Write,
    columns: &[],
};

// $1 scope, $2 the new ids, $3 now, $4 expires_at.
static RECORD: Statement = Statement {
    sql: "INSERT INTO idempotency.messages (scope, message_id, seen_at, expires_at) \
          SELECT $1, id, $3, $4 FROM pg_catalog.unnest($2) AS id",
    args: &[TEXTOID, TEXTARRAYOID, TIMESTAMPTZOID, TIMESTAMPTZOID],
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
    let live = |expiry: &Option<TimestampWithTimeZone>| expiry.is_some_and(|e| e > now);
    // Some(expiry) when the direct read was taken.
    let direct = direct::read(Table::Messages, scope, message_id, READ.columns, now, |row| {
        row.map(|row| get_not_null::<TimestampWithTimeZone>(row, &READ, "expires_at"))
    });
    if direct.as_ref().is_some_and(live) {
        return Ok(false);
    }
    Spi::connect_mut(|client| {
        let first = match direct {
            Some(expiry) => expiry,
            None => read_with_spi(client, scope, message_id),
        };
        if live(&first) {
            return Ok(false);
        }
        // Row-level security: the INSERT policy answers before any wait (src/policy.rs).
        if !keylock::try_lock(Space::Messages, scope, message_id) {
            if policy::applies(c"messages") {
                policy::trial(|| record(client, scope, &[message_id], now, now + ttl, false));
            }
            keylock::lock(Space::Messages, scope, message_id);
        }
        let latest = read_latest(client, scope, message_id, now);
        if latest != first {
            if snapshot_is_kept() {
                return Err(IdemError::ConcurrentChange { deleted: latest.is_none() });
            }
            if live(&latest) {
                return Ok(false);
            }
        }
        record(client, scope, &[message_id], now, now + ttl, latest.is_some());
        Ok(true)
    })
}

fn read_statement() -> &'static Statement {
    if direct::legacy_exists(Table::Messages) {
        &READ_WITH_LEGACY
    } else {
        &READ
    }
}

fn read_with_spi(client: &mut SpiClient<'_>, scope: &str, message_id: &str) -> Option<TimestampWithTimeZone> {
    let statement = read_statement();
    let found = spi::run(client, statement, &[scope.into(), message_id.into()]);
    (!found.is_empty()).then(|| get_not_null(&found.first(), statement, "expires_at"))
}

/// The id's record under the latest snapshot (what a sighting reads once it holds the lock).
fn read_latest(
    client: &mut SpiClient<'_>,
    scope: &str,
    message_id: &str,
    now: TimestampWithTimeZone,
) -> Option<TimestampWithTimeZone> {
    // SAFETY: pushed and popped around the read; an error's abort unwinds the stack.
    unsafe { pg_sys::PushActiveSnapshot(pg_sys::GetLatestSnapshot()) };
    let found = direct::read(Table::Messages, scope, message_id, READ.columns, now, |row| {
        row.map(|row| get_not_null::<TimestampWithTimeZone>(row, &READ, "expires_at"))
    })
    .unwrap_or_else(|| read_with_spi(client, scope, message_id));
    unsafe { pg_sys::PopActiveSnapshot() };
    found
}

/// REPEATABLE READ or SERIALIZABLE: the transaction's snapshot is kept for all its reads.
fn snapshot_is_kept() -> bool {
    // SAFETY: a plain read of the transaction's isolation level.
    unsafe { pg_sys::XactIsoLevel >= pg_sys::XACT_REPEATABLE_READ as i32 }
}

/// Records `ids` (locked, none live), deleting their expired records first when `expired`
/// says there may be some.
fn record(
    client: &mut SpiClient<'_>,
    scope: &str,
    ids: &[&str],
    now: TimestampWithTimeZone,
    expires_at: TimestampWithTimeZone,
    expired: bool,
) {
    let ids = ids.to_vec();
    if expired {
        spi::run(client, &DELETE_EXPIRED, &[scope.into(), ids.clone().into(), now.into()]);
        if direct::legacy_exists(Table::Messages) {
            spi::run(client, &DELETE_EXPIRED_LEGACY, &[scope.into(), ids.clone().into(), now.into()]);
        }
    }
    spi::run(client, &RECORD, &[scope.into(), ids.into(), now.into(), expires_at.into()]);
}

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
    let distinct = in_lock_order(&ids);
    let recorded: HashSet<String> = Spi::connect_mut(|client| {
        // Each id's latest expiry (None: never seen).
        let latest = |client: &mut SpiClient<'_>| -> Vec<(String, Option<TimestampWithTimeZone>)> {
            let statement =
                if direct::legacy_exists(Table::Messages) { &LATEST_WITH_LEGACY } else { &LATEST };
            spi::run(client, statement, &[scope.into(), distinct.clone().into()])
                .map(|row| {
                    (
                        get_not_null::<String>(&row, statement, "message_id"),
                        spi::get(&row, statement, "latest"),
                    )
                })
                .collect()
        };
        let first = latest(client);
        let new: Vec<&str> = distinct
            .iter()
            .copied()
            .filter(|id| !first.iter().any(|(seen, expiry)| seen == id && expiry.is_some_and(|e| e > now)))
            .collect();
        if new.is_empty() {
            return Ok(HashSet::new());
        }
        // In byte order: the ids free now at once, then (after the policy's answer where
        // row-level security applies, src/policy.rs) the rest, waiting for each in turn.
        let free = new.iter().take_while(|id| keylock::try_lock(Space::Messages, scope, id)).count();
        if free < new.len() {
            if policy::applies(c"messages") {
                policy::trial(|| record(client, scope, &new, now, now + ttl, false));
            }
            for id in &new[free..] {
                keylock::lock(Space::Messages, scope, id);
            }
        }
        // SAFETY: pushed and popped around the read; an error's abort unwinds the stack.
        unsafe { pg_sys::PushActiveSnapshot(pg_sys::GetLatestSnapshot()) };
        let after = latest(client);
        unsafe { pg_sys::PopActiveSnapshot() };
        let changed = |id: &str| {
            let of = |list: &Vec<(String, Option<TimestampWithTimeZone>)>| {
                list.iter().find(|(seen, _)| seen == id).and_then(|(_, e)| *e)
            };
            of(&first) != of(&after)
        };
        if snapshot_is_kept() && new.iter().any(|id| changed(id)) {
            return Err(IdemError::ConcurrentChange { deleted: false });
        }
        let still_new: Vec<&str> = new
            .iter()
            .copied()
            .filter(|id| !after.iter().any(|(seen, expiry)| seen == id && expiry.is_some_and(|e| e > now)))
            .collect();
        let expired =
            still_new.iter().any(|id| after.iter().any(|(seen, expiry)| seen == id && expiry.is_some()));
        if !still_new.is_empty() {
            record(client, scope, &still_new, now, now + ttl, expired);
        }
        Ok(still_new.into_iter().map(str::to_string).collect())
    })?;
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
