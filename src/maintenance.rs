//! idem_sweep and idem_reclaim_stale: housekeeping that never waits for a claim.
//!
//! Both pick their rows with FOR UPDATE SKIP LOCKED: a row that a claim is replacing or
//! taking over right now is locked by it, so it is skipped rather than waited for or lost.

use pgrx::datum::{Interval, TimestampWithTimeZone, Uuid};
use pgrx::pg_sys::{INT4OID, INT8OID, TEXTARRAYOID, TEXTOID, TIMESTAMPTZOID, UUIDOID};
use pgrx::spi::SpiClient;
use pgrx::prelude::*;

use crate::claim::interval_arg;
use crate::errors::{raise, IdemError};
use crate::jsonb::Jsonb;
use crate::spi::{self, col, Kind, Statement};
use crate::{settings, validate};

// Sweeping is two statements so that each batch costs its own size, not the backlog's:
// pick at most $2 expired rows, then delete exactly those by primary key. $1 is now().
//
// On one server the pick locks what it picks and skips the rows a claim holds. On Citus,
// where the tables are distributed by scope, a multi-shard SELECT cannot lock rows (0A000
// "could not run distributed query with FOR UPDATE/SHARE commands"): there the pick does not
// lock, the delete re-checks expiry under the row lock, so a record that a claim replaced
// meanwhile is kept (the delete waits for that claim instead of skipping it), and
// `scope = ANY($1)` lets Citus send the delete only to the shards of the batch.
macro_rules! pick_expired {
    ($table:literal, $id:literal, $lock:literal) => {
        concat!(
            "SELECT pg_catalog.array_agg(scope), pg_catalog.array_agg(", $id, ") \
             FROM (SELECT scope, ", $id, " FROM ", $table, " \
                   WHERE expires_at OPERATOR(pg_catalog.<=) $1 \
                   ORDER BY expires_at LIMIT $2", $lock, ") AS picked"
        )
    };
}

// $1 scopes, $2 keys (or message ids), $3 now: the picked rows, still expired.
macro_rules! delete_picked {
    ($table:literal, $id:literal, $prune:literal) => {
        concat!(
            "DELETE FROM ", $table, " AS t \
             USING ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS picked(scope, id) \
             WHERE ", $prune, "t.scope OPERATOR(pg_catalog.=) picked.scope \
               AND t.", $id, " OPERATOR(pg_catalog.=) picked.id \
               AND t.expires_at OPERATOR(pg_catalog.<=) $3"
        )
    };
}

// Live in_progress claims whose lease ended, oldest lease first; $1 now, $2 max rows.
// Locked and skipping on one server, unlocked on Citus, as the sweep's pick.
macro_rules! stale_claims {
    ($lock:literal) => {
        concat!(
            "SELECT scope, key, token, attempts FROM idempotency.keys \
             WHERE status OPERATOR(pg_catalog.=) 'in_progress' \
               AND locked_until OPERATOR(pg_catalog.<=) $1 \
               AND expires_at OPERATOR(pg_catalog.>) $1 \
             ORDER BY locked_until LIMIT $2",
            $lock
        )
    };
}

static PICK_EXPIRED_KEYS_CITUS: Statement = Statement {
    sql: pick_expired!("idempotency.keys", "key", ""),
    args: &[TIMESTAMPTZOID, INT8OID],
    kind: Kind::Read,
};

static DELETE_PICKED_KEYS_CITUS: Statement = Statement {
    sql: delete_picked!("idempotency.keys", "key", "t.scope OPERATOR(pg_catalog.=) ANY ($1) AND "),
    args: &[TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZOID],
    kind: Kind::Write,
};

static PICK_EXPIRED_MESSAGES_CITUS: Statement = Statement {
    sql: pick_expired!("idempotency.messages", "message_id", ""),
    args: &[TIMESTAMPTZOID, INT8OID],
    kind: Kind::Read,
};

static DELETE_PICKED_MESSAGES_CITUS: Statement = Statement {
    sql: delete_picked!("idempotency.messages", "message_id", "t.scope OPERATOR(pg_catalog.=) ANY ($1) AND "),
    args: &[TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZOID],
    kind: Kind::Write,
};

// STALE without the lock, for distributed tables: RELEASE_STALE / TAKE_OVER_STALE re-check
// token, status and lease under the row lock (waiting for a claim that holds the row).
static STALE_CITUS: Statement = Statement {
    sql: stale_claims!(""),
    args: &[TIMESTAMPTZOID, INT8OID],
    kind: Kind::Read,
};

static CITUS_INSTALLED: Statement = Statement {
    sql: "SELECT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus')",
    args: &[],
    kind: Kind::Read,
};

// Names a Citus catalog: prepared and run only where Citus is installed.
static DISTRIBUTED: Statement = Statement {
    sql: "SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition \
                         WHERE logicalrelid OPERATOR(pg_catalog.=) 'idempotency.keys'::pg_catalog.regclass), \
                 EXISTS (SELECT FROM pg_catalog.pg_dist_partition \
                         WHERE logicalrelid OPERATOR(pg_catalog.=) 'idempotency.messages'::pg_catalog.regclass)",
    args: &[],
    kind: Kind::Read,
};

/// Whether idempotency.keys and idempotency.messages are Citus distributed tables.
fn distributed(client: &mut SpiClient<'_>) -> (bool, bool) {
    let citus: bool = col(&spi::run(client, &CITUS_INSTALLED, &[]).first(), 1).unwrap_or(false);
    if !citus {
        return (false, false);
    }
    let row = spi::run(client, &DISTRIBUTED, &[]).first();
    (col(&row, 1).unwrap_or(false), col(&row, 2).unwrap_or(false))
}

static PICK_EXPIRED_KEYS: Statement = Statement {
    sql: pick_expired!("idempotency.keys", "key", " FOR UPDATE SKIP LOCKED"),
    args: &[TIMESTAMPTZOID, INT8OID],
    kind: Kind::Write,
};

static DELETE_PICKED_KEYS: Statement = Statement {
    sql: delete_picked!("idempotency.keys", "key", ""),
    args: &[TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZOID],
    kind: Kind::Write,
};

static PICK_EXPIRED_MESSAGES: Statement = Statement {
    sql: pick_expired!("idempotency.messages", "message_id", " FOR UPDATE SKIP LOCKED"),
    args: &[TIMESTAMPTZOID, INT8OID],
    kind: Kind::Write,
};

static DELETE_PICKED_MESSAGES: Statement = Statement {
    sql: delete_picked!("idempotency.messages", "message_id", ""),
    args: &[TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZOID],
    kind: Kind::Write,
};

static STALE: Statement = Statement {
    sql: stale_claims!(" FOR UPDATE SKIP LOCKED"),
    args: &[TIMESTAMPTZOID, INT8OID],
    kind: Kind::Write,
};

/// `head` + "(scope $1, key $2) is still the stale claim of token $3 at time $4" + RETURNING.
macro_rules! still_stale {
    ($head:literal) => {
        concat!(
            $head,
            " WHERE scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2 \
               AND token OPERATOR(pg_catalog.=) $3 \
               AND status OPERATOR(pg_catalog.=) 'in_progress' \
               AND locked_until OPERATOR(pg_catalog.<=) $4 \
               AND expires_at OPERATOR(pg_catalog.>) $4 \
             RETURNING recovery_point, recovery_data"
        )
    };
}

static RELEASE_STALE: Statement = Statement {
    sql: still_stale!("DELETE FROM idempotency.keys"),
    args: &[TEXTOID, TEXTOID, UUIDOID, TIMESTAMPTZOID],
    kind: Kind::Write,
};

// $5 new token, $6 attempts, $7 locked_until
static TAKE_OVER_STALE: Statement = Statement {
    sql: still_stale!(
        "UPDATE idempotency.keys SET token = $5, attempts = $6, locked_until = $7, updated_at = $4"
    ),
    args: &[TEXTOID, TEXTOID, UUIDOID, TIMESTAMPTZOID, UUIDOID, INT4OID, TIMESTAMPTZOID],
    kind: Kind::Write,
};

#[pg_extern(volatile, parallel_unsafe)]
fn idem_sweep(max_rows: default!(Option<i32>, 10000)) -> i64 {
    match sweep(max_rows) {
        Ok(deleted) => deleted,
        Err(e) => raise(e),
    }
}

/// scope, key, token, attempts, recovery_point, recovery_data
type StaleRow = (String, String, Uuid, i32, Option<String>, Option<Jsonb>);

#[pg_extern(volatile, parallel_unsafe)]
fn idem_reclaim_stale(
    max_rows: default!(Option<i32>, 1000),
    release: default!(Option<bool>, true),
    lease: default!(Option<Interval>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(scope, String),
        name!(key, String),
        name!(token, Uuid),
        name!(attempts, i32),
        name!(recovery_point, Option<String>),
        name!(recovery_data, Option<Jsonb>),
    ),
> {
    match reclaim_stale(max_rows, release, lease) {
        Ok(rows) => TableIterator::new(rows),
        Err(e) => raise(e),
    }
}

fn sweep(max_rows: Option<i32>) -> Result<i64, IdemError> {
    let budget = validate::max_rows(max_rows)?;
    spi::require_primary("idem_sweep")?;
    let now = spi::now();
    Ok(Spi::connect_mut(|client| {
        let (keys_distributed, messages_distributed) = distributed(client);
        let keys = if keys_distributed {
            sweep_table(client, &PICK_EXPIRED_KEYS_CITUS, &DELETE_PICKED_KEYS_CITUS, now, budget)
        } else {
            sweep_table(client, &PICK_EXPIRED_KEYS, &DELETE_PICKED_KEYS, now, budget)
        };
        if keys >= budget {
            return keys;
        }
        let (pick, delete) = if messages_distributed {
            (&PICK_EXPIRED_MESSAGES_CITUS, &DELETE_PICKED_MESSAGES_CITUS)
        } else {
            (&PICK_EXPIRED_MESSAGES, &DELETE_PICKED_MESSAGES)
        };
        keys + sweep_table(client, pick, delete, now, budget - keys)
    }))
}

fn sweep_table(
    client: &mut SpiClient<'_>,
    pick: &'static Statement,
    delete: &'static Statement,
    now: TimestampWithTimeZone,
    budget: i64,
) -> i64 {
    let picked = spi::run(client, pick, &[now.into(), budget.into()]).first();
    // The arrays stay SPI's datums: they only go back into the next statement.
    let (Some(scopes), Some(ids)) = (spi::raw_col(&picked, 1), spi::raw_col(&picked, 2)) else {
        return 0; // nothing expired
    };
    spi::run(client, delete, &[scopes, ids, now.into()]);
    spi::processed() as i64
}

fn reclaim_stale(
    max_rows: Option<i32>,
    release: Option<bool>,
    lease: Option<Interval>,
) -> Result<Vec<StaleRow>, IdemError> {
    let budget = validate::max_rows(max_rows)?;
    let release = validate::required("release", release)?;
    let lease = interval_arg("lease", lease, settings::default_lease)?;
    spi::require_primary("idem_reclaim_stale")?;
    let now = spi::now();
    let locked_until = now + lease;
    Ok(Spi::connect_mut(|client| {
        let pick = if distributed(client).0 { &STALE_CITUS } else { &STALE };
        let stale: Vec<(String, String, Uuid, i32)> = spi::run(client, pick, &[now.into(), budget.into()])
            .map(|row| {
                (
                    row.get(1).ok().flatten().expect("scope is NOT NULL"),
                    row.get(2).ok().flatten().expect("key is NOT NULL"),
                    row.get(3).ok().flatten().expect("token is NOT NULL"),
                    row.get(4).ok().flatten().expect("attempts is NOT NULL"),
                )
            })
            .collect();
        let mut done = Vec::with_capacity(stale.len());
        for (scope, key, token, attempts) in stale {
            let fence = [scope.as_str().into(), key.as_str().into(), token.into(), now.into()];
            let (token, attempts, changed) = if release {
                (token, attempts, spi::run(client, &RELEASE_STALE, &fence))
            } else {
                let new_token = spi::new_token();
                let [s, k, t, n] = fence;
                let args = [s, k, t, n, new_token.into(), (attempts + 1).into(), locked_until.into()];
                (new_token, attempts + 1, spi::run(client, &TAKE_OVER_STALE, &args))
            };
            // Nothing changed when a claim took the row over after we read it.
            if !changed.is_empty() {
                let row = changed.first();
                done.push((scope, key, token, attempts, col(&row, 1), col(&row, 2)));
            }
        }
        done
    }))
}
