//! idem_sweep and idem_reclaim_stale: housekeeping that never waits for a claim.
//!
//! On one server both pick their rows with FOR UPDATE SKIP LOCKED: a row that a claim is
//! replacing or taking over right now is locked by it, so it is skipped rather than waited
//! for or lost. On Citus, where the tables are distributed by scope, a multi-shard SELECT
//! cannot lock rows (0A000 "could not run distributed query with FOR UPDATE/SHARE
//! commands"): there the pick does not lock, and the statement that changes a picked row
//! re-checks it under the row lock (waiting for a claim that holds the row instead of
//! skipping it), so a row that a claim changed meanwhile is kept. Each such statement comes
//! in both forms below, side by side (`ForEach`).

use pgrx::datum::{Interval, TimestampWithTimeZone, Uuid};
use pgrx::pg_sys::{INT4OID, INT8OID, TEXTARRAYOID, TEXTOID, TIMESTAMPTZOID, UUIDOID};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

use crate::errors::{IdemError, OrRaise};
use crate::jsonb::Jsonb;
use crate::spi::{self, get, get_datum, get_not_null, Kind, Statement};
use crate::{settings, validate};

/// Where a table lives.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Deployment {
    /// A plain table on one server.
    OneServer,
    /// A Citus distributed table.
    Citus,
}

/// A statement in the form each deployment needs.
struct ForEach {
    one_server: Statement,
    citus: Statement,
}

impl ForEach {
    fn on(&'static self, deployment: Deployment) -> &'static Statement {
        match deployment {
            Deployment::OneServer => &self.one_server,
            Deployment::Citus => &self.citus,
        }
    }
}

/// Sweeping a table is two statements so that each batch costs its own size, not the
/// backlog's: `pick` at most $2 expired rows ($1 is now()), then `delete` exactly those by
/// primary key ($1 scopes, $2 keys or message ids, $3 now), if they are still expired. On
/// Citus, `scope = ANY($1)` lets the delete go only to the shards of the batch.
struct Sweep {
    pick: ForEach,
    delete: ForEach,
}

static SWEEP_KEYS: Sweep = Sweep {
    pick: ForEach {
        one_server: Statement {
            sql: "SELECT pg_catalog.array_agg(scope) AS scopes, pg_catalog.array_agg(key) AS ids \
                  FROM (SELECT scope, key FROM idempotency.keys \
                        WHERE expires_at OPERATOR(pg_catalog.<=) $1 \
                        ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED) AS picked",
            args: &[TIMESTAMPTZOID, INT8OID],
            kind: Kind::Write,
            columns: &["scopes", "ids"],
        },
        citus: Statement {
            sql: "SELECT pg_catalog.array_agg(scope) AS scopes, pg_catalog.array_agg(key) AS ids \
                  FROM (SELECT scope, key FROM idempotency.keys \
                        WHERE expires_at OPERATOR(pg_catalog.<=) $1 \
                        ORDER BY expires_at LIMIT $2) AS picked",
            args: &[TIMESTAMPTZOID, INT8OID],
            kind: Kind::Read,
            columns: &["scopes", "ids"],
        },
    },
    delete: ForEach {
        one_server: Statement {
            sql: "DELETE FROM idempotency.keys AS t \
                  USING ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS picked(scope, id) \
                  WHERE t.scope OPERATOR(pg_catalog.=) picked.scope \
                    AND t.key OPERATOR(pg_catalog.=) picked.id \
                    AND t.expires_at OPERATOR(pg_catalog.<=) $3",
            args: &[TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZOID],
            kind: Kind::Write,
            columns: &[],
        },
        citus: Statement {
            sql: "DELETE FROM idempotency.keys AS t \
                  USING ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS picked(scope, id) \
                  WHERE t.scope OPERATOR(pg_catalog.=) ANY ($1) \
                    AND t.scope OPERATOR(pg_catalog.=) picked.scope \
                    AND t.key OPERATOR(pg_catalog.=) picked.id \
                    AND t.expires_at OPERATOR(pg_catalog.<=) $3",
            args: &[TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZOID],
            kind: Kind::Write,
            columns: &[],
        },
    },
};

static SWEEP_MESSAGES: Sweep = Sweep {
    pick: ForEach {
        one_server: Statement {
            sql: "SELECT pg_catalog.array_agg(scope) AS scopes, pg_catalog.array_agg(message_id) AS ids \
                  FROM (SELECT scope, message_id FROM idempotency.messages \
                        WHERE expires_at OPERATOR(pg_catalog.<=) $1 \
                        ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED) AS picked",
            args: &[TIMESTAMPTZOID, INT8OID],
            kind: Kind::Write,
            columns: &["scopes", "ids"],
        },
        citus: Statement {
            sql: "SELECT pg_catalog.array_agg(scope) AS scopes, pg_catalog.array_agg(message_id) AS ids \
                  FROM (SELECT scope, message_id FROM idempotency.messages \
                        WHERE expires_at OPERATOR(pg_catalog.<=) $1 \
                        ORDER BY expires_at LIMIT $2) AS picked",
            args: &[TIMESTAMPTZOID, INT8OID],
            kind: Kind::Read,
            columns: &["scopes", "ids"],
        },
    },
    delete: ForEach {
        one_server: Statement {
            sql: "DELETE FROM idempotency.messages AS t \
                  USING ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS picked(scope, id) \
                  WHERE t.scope OPERATOR(pg_catalog.=) picked.scope \
                    AND t.message_id OPERATOR(pg_catalog.=) picked.id \
                    AND t.expires_at OPERATOR(pg_catalog.<=) $3",
            args: &[TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZOID],
            kind: Kind::Write,
            columns: &[],
        },
        citus: Statement {
            sql: "DELETE FROM idempotency.messages AS t \
                  USING ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS picked(scope, id) \
                  WHERE t.scope OPERATOR(pg_catalog.=) ANY ($1) \
                    AND t.scope OPERATOR(pg_catalog.=) picked.scope \
                    AND t.message_id OPERATOR(pg_catalog.=) picked.id \
                    AND t.expires_at OPERATOR(pg_catalog.<=) $3",
            args: &[TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZOID],
            kind: Kind::Write,
            columns: &[],
        },
    },
};

/// Live in_progress claims whose lease ended, oldest lease first; $1 now, $2 max rows.
/// RELEASE_STALE and TAKE_OVER_STALE re-check them under the row lock.
static STALE: ForEach = ForEach {
    one_server: Statement {
        sql: "SELECT scope, key, token, attempts FROM idempotency.keys \
              WHERE status OPERATOR(pg_catalog.=) 'in_progress' \
                AND locked_until OPERATOR(pg_catalog.<=) $1 \
                AND expires_at OPERATOR(pg_catalog.>) $1 \
              ORDER BY locked_until LIMIT $2 FOR UPDATE SKIP LOCKED",
        args: &[TIMESTAMPTZOID, INT8OID],
        kind: Kind::Write,
        columns: &["scope", "key", "token", "attempts"],
    },
    citus: Statement {
        sql: "SELECT scope, key, token, attempts FROM idempotency.keys \
              WHERE status OPERATOR(pg_catalog.=) 'in_progress' \
                AND locked_until OPERATOR(pg_catalog.<=) $1 \
                AND expires_at OPERATOR(pg_catalog.>) $1 \
              ORDER BY locked_until LIMIT $2",
        args: &[TIMESTAMPTZOID, INT8OID],
        kind: Kind::Read,
        columns: &["scope", "key", "token", "attempts"],
    },
};

// The same on every deployment (each touches one scope, so one shard on Citus): while
// (scope $1, key $2) is still the stale claim of token $3 at time $4, release it ...
static RELEASE_STALE: Statement = Statement {
    sql: "DELETE FROM idempotency.keys \
          WHERE scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2 \
            AND token OPERATOR(pg_catalog.=) $3 \
            AND status OPERATOR(pg_catalog.=) 'in_progress' \
            AND locked_until OPERATOR(pg_catalog.<=) $4 \
            AND expires_at OPERATOR(pg_catalog.>) $4 \
          RETURNING recovery_point, recovery_data",
    args: &[TEXTOID, TEXTOID, UUIDOID, TIMESTAMPTZOID],
    kind: Kind::Write,
    columns: &["recovery_point", "recovery_data"],
};

// ... or take it over: $5 new token, $6 attempts, $7 locked_until.
static TAKE_OVER_STALE: Statement = Statement {
    sql: "UPDATE idempotency.keys SET token = $5, attempts = $6, locked_until = $7, updated_at = $4 \
          WHERE scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2 \
            AND token OPERATOR(pg_catalog.=) $3 \
            AND status OPERATOR(pg_catalog.=) 'in_progress' \
            AND locked_until OPERATOR(pg_catalog.<=) $4 \
            AND expires_at OPERATOR(pg_catalog.>) $4 \
          RETURNING recovery_point, recovery_data",
    args: &[TEXTOID, TEXTOID, UUIDOID, TIMESTAMPTZOID, UUIDOID, INT4OID, TIMESTAMPTZOID],
    kind: Kind::Write,
    columns: &["recovery_point", "recovery_data"],
};

static CITUS_INSTALLED: Statement = Statement {
    sql: "SELECT EXISTS (SELECT FROM pg_catalog.pg_extension \
                         WHERE extname OPERATOR(pg_catalog.=) 'citus') AS installed",
    args: &[],
    kind: Kind::Read,
    columns: &["installed"],
};

// Names a Citus catalog: prepared and run only where Citus is installed.
static DISTRIBUTED: Statement = Statement {
    sql: "SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition \
                         WHERE logicalrelid OPERATOR(pg_catalog.=) 'idempotency.keys'::pg_catalog.regclass) AS keys, \
                 EXISTS (SELECT FROM pg_catalog.pg_dist_partition \
                         WHERE logicalrelid OPERATOR(pg_catalog.=) 'idempotency.messages'::pg_catalog.regclass) AS messages",
    args: &[],
    kind: Kind::Read,
    columns: &["keys", "messages"],
};

/// Where idempotency.keys and idempotency.messages live.
struct Tables {
    keys: Deployment,
    messages: Deployment,
}

fn tables(client: &mut SpiClient<'_>) -> Tables {
    let citus: bool =
        get(&spi::run(client, &CITUS_INSTALLED, &[]).first(), &CITUS_INSTALLED, "installed").unwrap_or(false);
    if !citus {
        return Tables { keys: Deployment::OneServer, messages: Deployment::OneServer };
    }
    let row = spi::run(client, &DISTRIBUTED, &[]).first();
    let on = |distributed: Option<bool>| {
        if distributed.unwrap_or(false) {
            Deployment::Citus
        } else {
            Deployment::OneServer
        }
    };
    Tables { keys: on(get(&row, &DISTRIBUTED, "keys")), messages: on(get(&row, &DISTRIBUTED, "messages")) }
}

#[pg_extern(volatile, parallel_unsafe)]
fn idem_sweep(max_rows: default!(Option<i32>, 10000)) -> i64 {
    sweep(max_rows).or_raise()
}

/// A row of idem_reclaim_stale.
struct Reclaimed {
    scope: String,
    key: String,
    token: Uuid,
    attempts: i32,
    recovery_point: Option<String>,
    recovery_data: Option<Jsonb>,
}

// The result type is spelled out for #[pg_extern], which reads the column names from it.
#[allow(clippy::type_complexity)]
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
    let rows = reclaim_stale(max_rows, release, lease).or_raise();
    TableIterator::new(
        rows.into_iter().map(|r| (r.scope, r.key, r.token, r.attempts, r.recovery_point, r.recovery_data)),
    )
}

fn sweep(max_rows: Option<i32>) -> Result<i64, IdemError> {
    let budget = validate::max_rows(max_rows)?;
    spi::require_primary("idem_sweep")?;
    let now = spi::now();
    Ok(Spi::connect_mut(|client| {
        let tables = tables(client);
        let keys = sweep_table(client, &SWEEP_KEYS, tables.keys, now, budget);
        if keys >= budget {
            return keys;
        }
        keys + sweep_table(client, &SWEEP_MESSAGES, tables.messages, now, budget - keys)
    }))
}

fn sweep_table(
    client: &mut SpiClient<'_>,
    sweep: &'static Sweep,
    deployment: Deployment,
    now: TimestampWithTimeZone,
    budget: i64,
) -> i64 {
    let pick = sweep.pick.on(deployment);
    let picked = spi::run(client, pick, &[now.into(), budget.into()]).first();
    // The arrays stay SPI's datums: they only go back into the next statement.
    let (Some(scopes), Some(ids)) = (get_datum(&picked, pick, "scopes"), get_datum(&picked, pick, "ids"))
    else {
        return 0; // nothing expired
    };
    spi::run(client, sweep.delete.on(deployment), &[scopes, ids, now.into()]);
    spi::processed() as i64
}

fn reclaim_stale(
    max_rows: Option<i32>,
    release: Option<bool>,
    lease: Option<Interval>,
) -> Result<Vec<Reclaimed>, IdemError> {
    let budget = validate::max_rows(max_rows)?;
    let release = validate::required("release", release)?;
    let lease = validate::interval_arg("lease", lease, settings::default_lease)?;
    spi::require_primary("idem_reclaim_stale")?;
    let now = spi::now();
    let locked_until = now + lease;
    Ok(Spi::connect_mut(|client| {
        let pick = STALE.on(tables(client).keys);
        let stale: Vec<(String, String, Uuid, i32)> = spi::run(client, pick, &[now.into(), budget.into()])
            .map(|row| {
                (
                    get_not_null(&row, pick, "scope"),
                    get_not_null(&row, pick, "key"),
                    get_not_null(&row, pick, "token"),
                    get_not_null(&row, pick, "attempts"),
                )
            })
            .collect();
        let mut done = Vec::with_capacity(stale.len());
        for (scope, key, token, attempts) in stale {
            let fence = [scope.as_str().into(), key.as_str().into(), token.into(), now.into()];
            let (token, attempts, stmt, changed) = if release {
                (token, attempts, &RELEASE_STALE, spi::run(client, &RELEASE_STALE, &fence))
            } else {
                let new_token = spi::new_token();
                let [s, k, t, n] = fence;
                let args = [s, k, t, n, new_token.into(), (attempts + 1).into(), locked_until.into()];
                (new_token, attempts + 1, &TAKE_OVER_STALE, spi::run(client, &TAKE_OVER_STALE, &args))
            };
            // Nothing changed when a claim took the row over after we read it.
            if !changed.is_empty() {
                let row = changed.first();
                done.push(Reclaimed {
                    scope,
                    key,
                    token,
                    attempts,
                    recovery_point: get(&row, stmt, "recovery_point"),
                    recovery_data: get(&row, stmt, "recovery_data"),
                });
            }
        }
        done
    }))
}
