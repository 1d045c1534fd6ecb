//! idem_sweep and idem_reclaim_stale: housekeeping that never waits for a claim.
//!
//! On one server both pick their rows with FOR UPDATE SKIP LOCKED: a row that a claim is
//! replacing or taking over right now is locked by it, so it is skipped rather than waited
//! for or lost. On Citus, where the tables are distributed by scope, a multi-shard SELECT
//! cannot lock rows (0A000 "could not run distributed query with FOR UPDATE/SHARE
//! commands"): there the pick does not lock, and the statement that changes a picked row
//! re-checks it under the row lock (waiting for a claim that holds the row instead of
//! skipping it), so a row that a claim changed meanwhile is kept. Each such statement comes
//! in both forms (`PerDeployment`), built from one template: `picking` for the picks,
//! `Sweep::new` for every sweep of keys and messages. src/deployment.rs says which form runs.

use std::sync::LazyLock;

use pgrx::datum::{Interval, TimestampWithTimeZone, Uuid};
use pgrx::pg_sys::{INT4OID, INT8OID, TEXTARRAYOID, TEXTOID, TIMESTAMPTZOID, UUIDOID};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

use crate::deployment::{self, Deployment, PerDeployment};
use crate::direct::{self, Table};
use crate::errors::{IdemError, OrRaise};
use crate::jsonb::Jsonb;
use crate::spi::{self, get, get_datum, get_not_null, Kind, Statement};
use crate::{settings, validate, wakeup};

/// A statement that picks rows ($1 a time: a cut-off or now(); at most $2 rows; for a sweep
/// $3 and $4 the span of the periods, for `Part::only`), in both forms: on one server it locks the rows
/// it picks and skips those that others hold (so it runs as a write); on Citus it picks
/// without locking (a read). `FOR UPDATE SKIP LOCKED` goes between `head` and `tail`.
fn picking(
    head: String,
    tail: &str,
    args: &'static [pgrx::pg_sys::Oid],
    columns: &'static [&'static str],
) -> PerDeployment {
    let form =
        |lock: &str, kind: Kind| Statement { sql: format!("{head}{lock}{tail}").leak(), args, kind, columns };
    PerDeployment { one_server: form(" FOR UPDATE SKIP LOCKED", Kind::Write), citus: form("", Kind::Read) }
}

/// What is swept row by row (src/layout.rs, docs/operations.md#partitions): the claims in
/// flight, the records past the periods (the far partitions, and the table of a database
/// updated from 0.5.0 while it is there). Periods are dropped whole by
/// idempotency.partitions_maintain(), never swept. Each part is reached through its table,
/// whose privileges and row-level security apply, with a condition that keeps the planner to
/// the partition: `only`, where {lo} and {hi} stand for the span of the periods (the
/// earliest lower and the latest upper bound, 'infinity' for both when there is none).
struct Part {
    table: &'static str,
    /// The column that names a row within its scope.
    id: &'static str,
    only: &'static str,
}

static CLAIMS: Part = Part { table: "idempotency.keys", id: "key", only: in_claims!() };
static KEYS_FAR: Part = Part {
    table: "idempotency.keys",
    id: "key",
    only: concat!(
        keys_partition_key!(),
        " OPERATOR(pg_catalog.>=) '1970-01-01 00:00:00+00'::pg_catalog.timestamptz AND (",
        keys_partition_key!(),
        " OPERATOR(pg_catalog.<) {lo} OR ",
        keys_partition_key!(),
        " OPERATOR(pg_catalog.>=) {hi})"
    ),
};
static MESSAGES_FAR: Part = Part {
    table: "idempotency.messages",
    id: "message_id",
    only: "(expires_at OPERATOR(pg_catalog.<) {lo} OR expires_at OPERATOR(pg_catalog.>=) {hi})",
};
static KEYS_LEGACY: Part = Part { table: "idempotency.keys_legacy", id: "key", only: "true" };
static MESSAGES_LEGACY: Part = Part { table: "idempotency.messages_legacy", id: "message_id", only: "true" };

/// What a sweep does to the rows it picked.
enum Change {
    Delete,
    /// Keep the row as a tombstone: drop its response and its checkpoint.
    DropResponse,
}

/// Sweeping a part is two statements so that each batch costs its own size, not the
/// backlog's: `pick` at most $2 rows of `filter` ($1 is the cut-off, now() without
/// tombstones), then `apply` the change to exactly those by primary key ($1 scopes, $2 keys
/// or message ids, $3 the cut-off, $4 and $5 the span of the periods), if they still match and
/// are still past the cut-off.
struct Sweep {
    pick: PerDeployment,
    apply: PerDeployment,
}

impl Sweep {
    /// The one template of every sweep, for every part and both deployments: `pick` the
    /// rows of `part` that match `filter`, in `order`; `apply` makes `change` to those that
    /// still match `also` (what it re-checks of `filter` besides the cut-off, on the row `t`).
    /// On Citus, `scope = ANY($1)` lets `apply` go only to the shards of the batch.
    fn new(part: &Part, filter: &str, order: &str, change: Change, also: &str) -> Sweep {
        let (name, id) = (part.table, part.id);
        let only_pick = part.only.replace("{lo}", "$3").replace("{hi}", "$4");
        let only_apply = part.only.replace("{lo}", "$4").replace("{hi}", "$5");
        let pick = picking(
            format!(
                "SELECT pg_catalog.array_agg(scope) AS scopes, pg_catalog.array_agg({id}) AS ids \
                 FROM (SELECT scope, {id} FROM {name} WHERE {only_pick} AND {filter} ORDER BY {order} LIMIT $2"
            ),
            ") AS picked",
            &[TIMESTAMPTZOID, INT8OID, TIMESTAMPTZOID, TIMESTAMPTZOID],
            &["scopes", "ids"],
        );
        let change = match change {
            Change::Delete => format!("DELETE FROM {name} AS t USING"),
            Change::DropResponse => format!(
                "UPDATE {name} AS t SET response_body = NULL, response_headers = NULL, \
                 recovery_point = NULL, recovery_data = NULL FROM"
            ),
        };
        let apply = |shards: &str| Statement {
            sql: format!(
                "{change} ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS picked(scope, id) \
                 WHERE {shards}{only_apply} AND t.scope OPERATOR(pg_catalog.=) picked.scope \
                   AND t.{id} OPERATOR(pg_catalog.=) picked.id{also} \
                   AND t.expires_at OPERATOR(pg_catalog.<=) $3"
            )
            .leak(),
            args: &[TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID],
            kind: Kind::Write,
            columns: &[],
        };
        Sweep {
            pick,
            apply: PerDeployment {
                one_server: apply(""),
                citus: apply("t.scope OPERATOR(pg_catalog.=) ANY ($1) AND "),
            },
        }
    }

    /// Deletes the rows of `part` that expired by the cut-off.
    fn expired(part: &Part) -> Sweep {
        Sweep::new(part, "expires_at OPERATOR(pg_catalog.<=) $1", "expires_at", Change::Delete, "")
    }
}

// The statements are built once per backend, on first use.
static SWEEP_CLAIMS: LazyLock<Sweep> = LazyLock::new(|| Sweep::expired(&CLAIMS));
static SWEEP_KEYS_FAR: LazyLock<Sweep> = LazyLock::new(|| Sweep::expired(&KEYS_FAR));
static SWEEP_MESSAGES_FAR: LazyLock<Sweep> = LazyLock::new(|| Sweep::expired(&MESSAGES_FAR));
static SWEEP_KEYS_LEGACY: LazyLock<Sweep> = LazyLock::new(|| Sweep::expired(&KEYS_LEGACY));
static SWEEP_MESSAGES_LEGACY: LazyLock<Sweep> = LazyLock::new(|| Sweep::expired(&MESSAGES_LEGACY));

// Tombstones on (idempotency.tombstone_ttl). The expired sweeps with the cut-off
// now() - tombstone_ttl delete the tombstones past their end (and every other record expired
// that long ago); the two below finish the job: claims that expired in_progress leave no
// tombstone, and completed records past the periods that expired drop their response (and
// checkpoint), keeping what a tombstone answers with: fingerprint, status, token, attempts,
// response_status and the times. (A period keeps its responses until it is dropped; its
// claims answer `expired` without them.)

// Picks through keys_responses_idx (its predicate is spelled the same), so the tombstones
// already made are not stepped over.
static MAKE_TOMBSTONES: LazyLock<Sweep> = LazyLock::new(|| make_tombstones(&KEYS_FAR));
static MAKE_TOMBSTONES_LEGACY: LazyLock<Sweep> = LazyLock::new(|| make_tombstones(&KEYS_LEGACY));

fn make_tombstones(part: &Part) -> Sweep {
    Sweep::new(
        part,
        "(response_body IS NOT NULL OR response_headers IS NOT NULL) \
         AND expires_at OPERATOR(pg_catalog.<=) $1",
        "expires_at",
        Change::DropResponse,
        " AND t.status OPERATOR(pg_catalog.=) 'completed'",
    )
}

/// Live in_progress claims whose lease ended, oldest lease first; $1 now, $2 max rows.
/// RELEASE_STALE and TAKE_OVER_STALE re-check them under the row lock.
static STALE: LazyLock<PerDeployment> = LazyLock::new(|| {
    picking(
        concat!(
            "SELECT scope, key, token, attempts FROM idempotency.keys WHERE ",
            in_claims!(),
            " AND status OPERATOR(pg_catalog.=) 'in_progress' \
           AND locked_until OPERATOR(pg_catalog.<=) $1 \
           AND expires_at OPERATOR(pg_catalog.>) $1 \
         ORDER BY locked_until LIMIT $2"
        )
        .to_string(),
        "",
        &[TIMESTAMPTZOID, INT8OID],
        &["scope", "key", "token", "attempts"],
    )
});

// The same on every deployment (each touches one scope, so one shard on Citus): while
// (scope $1, key $2) is still the stale claim of token $3 at time $4, release it ...
static RELEASE_STALE: Statement = Statement {
    sql: concat!(
        "DELETE FROM idempotency.keys WHERE ",
        in_claims!(),
        " AND scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2 \
            AND token OPERATOR(pg_catalog.=) $3 \
            AND status OPERATOR(pg_catalog.=) 'in_progress' \
            AND locked_until OPERATOR(pg_catalog.<=) $4 \
            AND expires_at OPERATOR(pg_catalog.>) $4 \
          RETURNING recovery_point, recovery_data"
    ),
    args: &[TEXTOID, TEXTOID, UUIDOID, TIMESTAMPTZOID],
    kind: Kind::Write,
    columns: &["recovery_point", "recovery_data"],
};

// ... or take it over: $5 new token, $6 attempts, $7 locked_until.
static TAKE_OVER_STALE: Statement = Statement {
    sql: concat!(
        "UPDATE idempotency.keys SET token = $5, attempts = $6, locked_until = $7, updated_at = $4 WHERE ",
        in_claims!(),
        " AND scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2 \
            AND token OPERATOR(pg_catalog.=) $3 \
            AND status OPERATOR(pg_catalog.=) 'in_progress' \
            AND locked_until OPERATOR(pg_catalog.<=) $4 \
            AND expires_at OPERATOR(pg_catalog.>) $4 \
          RETURNING recovery_point, recovery_data"
    ),
    args: &[TEXTOID, TEXTOID, UUIDOID, TIMESTAMPTZOID, UUIDOID, INT4OID, TIMESTAMPTZOID],
    kind: Kind::Write,
    columns: &["recovery_point", "recovery_data"],
};

/// Deletes expired records; with tombstones on, turns expired completed records into
/// tombstones and deletes tombstones past their end. Returns the rows it changed.
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
        let tables = deployment::tables(client);
        let keys_span = span(client, "idempotency.keys");
        let messages_span = span(client, "idempotency.messages");
        let legacy_keys = direct::legacy_exists(Table::Keys);
        let legacy_messages = direct::legacy_exists(Table::Messages);
        let tombstones = settings::tombstone_ttl();
        let kept = tombstones.map_or(now, |ttl| now - ttl);
        // (what, cut-off, span): claims leave no tombstone; past the periods, tombstones are
        // deleted once they end, completed records dropping their response when they expire.
        let mut sweeps: Vec<(&'static Sweep, TimestampWithTimeZone, Span)> =
            vec![(&SWEEP_CLAIMS, now, keys_span), (&SWEEP_KEYS_FAR, kept, keys_span)];
        if tombstones.is_some() {
            sweeps.push((&MAKE_TOMBSTONES, now, keys_span));
        }
        if legacy_keys {
            sweeps.push((&SWEEP_KEYS_LEGACY, kept, keys_span));
            if tombstones.is_some() {
                sweeps.push((&MAKE_TOMBSTONES_LEGACY, now, keys_span));
            }
        }
        sweeps.push((&SWEEP_MESSAGES_FAR, now, messages_span));
        if legacy_messages {
            sweeps.push((&SWEEP_MESSAGES_LEGACY, now, messages_span));
        }
        let mut done = 0;
        for (sweep, cut_off, span) in sweeps {
            if done >= budget {
                return done;
            }
            let deployment =
                if sweep.pick.one_server.sql.contains("messages") { tables.messages } else { tables.keys };
            done += sweep_part(client, sweep, deployment, cut_off, span, budget - done);
        }
        for (legacy, statement, table) in [
            (legacy_keys, &MOVE_KEYS_LEGACY, "idempotency.keys_legacy"),
            (legacy_messages, &MOVE_MESSAGES_LEGACY, "idempotency.messages_legacy"),
        ] {
            if legacy && done < budget {
                move_legacy(client, statement, table, now, budget - done);
            }
        }
        done += sweep_outbound(client, budget - done);
        maintain_partitions(client);
        done
    }))
}

/// The partitions made ahead and dropped behind (sql/partitions.sql), last: ATTACH and DROP
/// hold their locks until COMMIT, which right after this costs claims a few milliseconds at
/// most. Inside a transaction block it would hold them until the block ends, so there the
/// sweep leaves the partitions to the next sweep run on its own, and says so.
fn maintain_partitions(client: &mut SpiClient<'_>) {
    // SAFETY: a plain read of the transaction state.
    if unsafe { pgrx::pg_sys::IsTransactionBlock() } {
        let due = spi::run(client, &PARTITIONS_DUE, &[]).first();
        if get::<bool>(&due, &PARTITIONS_DUE, "due") == Some(true) {
            pgrx::notice!(
                "idem_sweep: partitions are made and dropped only by a sweep in a transaction of its own \
             (pg_cron runs it so); this one, in a transaction block, left them as they are"
            );
        }
        return;
    }
    spi::run(client, &MAINTAIN_PARTITIONS, &[]);
}

static PARTITIONS_DUE: Statement = Statement {
    sql: "SELECT idempotency.partitions_due() AS due",
    args: &[],
    kind: Kind::Read,
    columns: &["due"],
};

static MAINTAIN_PARTITIONS: Statement = Statement {
    sql: "SELECT pg_catalog.count(*) AS steps FROM idempotency.partitions_maintain()",
    args: &[],
    kind: Kind::Write,
    columns: &["steps"],
};

/// The earliest lower and the latest upper bound of a table's periods ('infinity' for both
/// when it has none): what `Part::only` keeps a sweep of the far partition out of.
type Span = (TimestampWithTimeZone, TimestampWithTimeZone);

static SPAN: Statement = Statement {
    sql: "SELECT COALESCE(pg_catalog.min(lower_bound), 'infinity') AS lo, \
                 COALESCE(pg_catalog.max(upper_bound), 'infinity') AS hi \
          FROM idempotency.partition_bounds($1::pg_catalog.regclass) \
          WHERE NOT is_default AND lower_bound IS NOT NULL",
    args: &[TEXTOID],
    kind: Kind::Read,
    columns: &["lo", "hi"],
};

fn span(client: &mut SpiClient<'_>, table: &str) -> Span {
    let row = spi::run(client, &SPAN, &[table.into()]).first();
    (get_not_null(&row, &SPAN, "lo"), get_not_null(&row, &SPAN, "hi"))
}

// A database updated from 0.5.0: its live records move from the table they were kept in
// into the partitions, at most $2 a sweep, latest expiry first ($1 now). Expired ones are
// only deleted (the sweeps above): a claim may be replacing one. A live record is never
// replaced, so moving it needs no key lock; a read sees it in one table or the other.
static MOVE_KEYS_LEGACY: Statement = Statement {
    sql: "WITH moved AS (DELETE FROM idempotency.keys_legacy AS l \
                         USING (SELECT scope, key FROM idempotency.keys_legacy \
                                 WHERE expires_at OPERATOR(pg_catalog.>) $1 \
                                 ORDER BY expires_at DESC LIMIT $2 FOR UPDATE SKIP LOCKED) AS p \
                         WHERE l.scope OPERATOR(pg_catalog.=) p.scope AND l.key OPERATOR(pg_catalog.=) p.key \
                           AND l.expires_at OPERATOR(pg_catalog.>) $1 \
                         RETURNING l.*) \
          INSERT INTO idempotency.keys SELECT * FROM moved",
    args: &[TIMESTAMPTZOID, INT8OID],
    kind: Kind::Write,
    columns: &[],
};

static MOVE_MESSAGES_LEGACY: Statement = Statement {
    sql: "WITH moved AS (DELETE FROM idempotency.messages_legacy AS l \
                         USING (SELECT scope, message_id FROM idempotency.messages_legacy \
                                 WHERE expires_at OPERATOR(pg_catalog.>) $1 \
                                 ORDER BY expires_at DESC LIMIT $2 FOR UPDATE SKIP LOCKED) AS p \
                         WHERE l.scope OPERATOR(pg_catalog.=) p.scope \
                           AND l.message_id OPERATOR(pg_catalog.=) p.message_id \
                           AND l.expires_at OPERATOR(pg_catalog.>) $1 \
                         RETURNING l.*) \
          INSERT INTO idempotency.messages SELECT * FROM moved",
    args: &[TIMESTAMPTZOID, INT8OID],
    kind: Kind::Write,
    columns: &[],
};

fn move_legacy(
    client: &mut SpiClient<'_>,
    statement: &'static Statement,
    table: &str,
    now: TimestampWithTimeZone,
    budget: i64,
) {
    spi::run(client, statement, &[now.into(), budget.into()]);
    let moved = spi::processed();
    if moved > 0 {
        pgrx::notice!("idem_sweep: moved {moved} live records from {table} into the partitions");
    }
}

/// The sending side's rows: sql/send.sql's send_sweep, shared with the portable edition.
static SWEEP_OUTBOUND: spi::Statement = spi::Statement {
    sql: "SELECT idempotency.send_sweep($1) AS deleted",
    args: &[INT8OID],
    kind: Kind::Write,
    columns: &["deleted"],
};

fn sweep_outbound(client: &mut SpiClient<'_>, budget: i64) -> i64 {
    let result = spi::run(client, &SWEEP_OUTBOUND, &[budget.into()]).first();
    spi::get::<i64>(&result, &SWEEP_OUTBOUND, "deleted").unwrap_or(0)
}

fn sweep_part(
    client: &mut SpiClient<'_>,
    sweep: &'static Sweep,
    deployment: Deployment,
    cut_off: TimestampWithTimeZone,
    (lo, hi): Span,
    budget: i64,
) -> i64 {
    let pick = sweep.pick.on(deployment);
    let picked = spi::run(client, pick, &[cut_off.into(), budget.into(), lo.into(), hi.into()]).first();
    // The arrays stay SPI's datums: they only go back into the next statement.
    let (Some(scopes), Some(ids)) = (get_datum(&picked, pick, "scopes"), get_datum(&picked, pick, "ids"))
    else {
        return 0; // nothing expired
    };
    spi::run(client, sweep.apply.on(deployment), &[scopes, ids, cut_off.into(), lo.into(), hi.into()]);
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
        let pick = STALE.on(deployment::tables(client).keys);
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
                if release {
                    wakeup::notify_on_commit(&scope, &key);
                }
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
