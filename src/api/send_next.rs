//! idem_send_next (docs/sending.md): hands a sender up to `max_rows` due sends, each now
//! `sending` under a lease with a fresh fencing token. The portable edition's is sql/send.sql's
//! send_take, step for step: per target (the given one, the one of the given operation, or
//! each with sends not finished, in order), due rows past give_up_at become gave_up; first
//! attempts are handed out, due-first; then retries, within the target's retry budget, by the
//! one sender that holds the target's lock (only tried: nothing here waits for a lock). Each
//! step is one statement that picks its rows with FOR UPDATE SKIP LOCKED and changes them.

use std::sync::LazyLock;

use pgrx::datum::{Interval, TimestampWithTimeZone, Uuid};
use pgrx::pg_sys::{Oid, INT8OID, INTERVALOID, TEXTOID};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

use super::send_budget;
use crate::budget_ledger::Counts;
use crate::errors::{IdemError, OrRaise};
use crate::jsonb::Jsonb;
use crate::spi::{self, get, get_not_null, Kind, Statement};
use crate::{sending, settings, validate};

/// A statement in two forms: for every due send of a target, and for the one send
/// (scope, operation) of it, whose two extra arguments come last.
struct Forms {
    target: Statement,
    one: Statement,
}

impl Forms {
    /// `template`'s `{one}` is where the one-send form names its row.
    fn new(template: &str, args: &'static [Oid], columns: &'static [&'static str]) -> Forms {
        let n = args.len();
        let one = format!(
            " AND o.scope OPERATOR(pg_catalog.=) ${} AND o.operation OPERATOR(pg_catalog.=) ${}",
            n + 1,
            n + 2
        );
        let one_args: Vec<Oid> = args.iter().copied().chain([TEXTOID, TEXTOID]).collect();
        Forms {
            target: Statement { sql: template.replace("{one}", "").leak(), args, kind: Kind::Fresh, columns },
            one: Statement {
                sql: template.replace("{one}", &one).leak(),
                args: one_args.leak(),
                kind: Kind::Fresh,
                columns,
            },
        }
    }
}

/// Rows not finished: what the partial indexes on give_up_at and on retries say, to the letter.
const LIVE: &str = "o.state OPERATOR(pg_catalog.=) ANY ('{pending,sending}'::pg_catalog.text[])";

/// Due rows of target $1 past give_up_at become gave_up ($2: idempotency.default_ttl).
/// Rows are changed by the ctid their pick locked (a TID scan), so that the plan kept for the
/// statement never depends on how many rows the pick is estimated to find.
static GIVE_UP: LazyLock<Forms> = LazyLock::new(|| {
    Forms::new(
        &format!(
            "UPDATE idempotency.outbound AS o \
                SET state = 'gave_up', token = NULL, locked_until = NULL, finished_at = pg_catalog.now(), \
                    expires_at = pg_catalog.now() OPERATOR(pg_catalog.+) $2, \
                    last_error = CASE WHEN o.state OPERATOR(pg_catalog.=) 'sending' \
                                      THEN 'lease ended without a result' ELSE o.last_error END \
              WHERE o.ctid OPERATOR(pg_catalog.=) ANY (ARRAY( \
                    SELECT o.ctid FROM idempotency.outbound AS o \
                     WHERE o.target OPERATOR(pg_catalog.=) $1 AND {LIVE} \
                       AND o.give_up_at OPERATOR(pg_catalog.<=) pg_catalog.now() \
                       AND o.next_attempt_at OPERATOR(pg_catalog.<=) pg_catalog.now(){{one}} \
                     ORDER BY o.next_attempt_at LIMIT {} FOR UPDATE SKIP LOCKED))",
            sending::MAX_GIVE_UPS
        ),
        &[TEXTOID, INTERVALOID],
        &[],
    )
});

const HANDED_COLUMNS: &[&str] =
    &["scope", "operation", "target", "key", "request", "attempt", "token", "locked_until", "give_up_at"];

/// Hands out at most $2 due rows of target $1 that `which` selects, due-first (ties in the
/// index's order), each `sending` under a lease of $3 with a fresh token and attempts + 1; a row
/// found past give_up_at becomes gave_up instead ($4: idempotency.default_ttl) and is not
/// returned. The rows are changed by the ctid their pick locked, as GIVE_UP's. (A row that
/// another transaction changed, committed after this statement began and that still qualifies
/// is locked at its new version, which this statement's snapshot does not see: it is left
/// for the next call, never handed out twice.)
fn hand_out(which: &str) -> Forms {
    let gave_up = "o.give_up_at OPERATOR(pg_catalog.<=) pg_catalog.now()";
    Forms::new(
        &format!(
            "WITH picked AS MATERIALIZED ( \
               SELECT o.ctid AS tid, o.next_attempt_at AS due, o.scope, o.operation \
                 FROM idempotency.outbound AS o \
                WHERE o.target OPERATOR(pg_catalog.=) $1 AND {which} \
                  AND o.next_attempt_at OPERATOR(pg_catalog.<=) pg_catalog.now(){{one}} \
                ORDER BY o.next_attempt_at LIMIT $2 FOR UPDATE SKIP LOCKED), \
             handed AS ( \
               UPDATE idempotency.outbound AS o \
                  SET state = CASE WHEN {gave_up} THEN 'gave_up' ELSE 'sending' END, \
                      attempts = CASE WHEN {gave_up} THEN o.attempts ELSE o.attempts OPERATOR(pg_catalog.+) 1 END, \
                      token = CASE WHEN {gave_up} THEN NULL ELSE pg_catalog.gen_random_uuid() END, \
                      locked_until = CASE WHEN {gave_up} THEN NULL ELSE pg_catalog.now() OPERATOR(pg_catalog.+) $3 END, \
                      next_attempt_at = CASE WHEN {gave_up} THEN o.next_attempt_at \
                                             ELSE pg_catalog.now() OPERATOR(pg_catalog.+) $3 END, \
                      finished_at = CASE WHEN {gave_up} THEN pg_catalog.now() ELSE o.finished_at END, \
                      expires_at = CASE WHEN {gave_up} THEN pg_catalog.now() OPERATOR(pg_catalog.+) $4 \
                                        ELSE o.expires_at END, \
                      last_error = CASE WHEN o.state OPERATOR(pg_catalog.=) 'sending' \
                                        THEN 'lease ended without a result' ELSE o.last_error END \
                WHERE o.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT p.tid FROM picked AS p)) \
               RETURNING o.scope, o.operation, o.target, o.key, o.request, o.attempts, o.token, \
                         o.locked_until, o.give_up_at, \
                         (SELECT p.due FROM picked AS p WHERE p.scope OPERATOR(pg_catalog.=) o.scope \
                             AND p.operation OPERATOR(pg_catalog.=) o.operation) AS due, \
                         (SELECT p.tid FROM picked AS p WHERE p.scope OPERATOR(pg_catalog.=) o.scope \
                             AND p.operation OPERATOR(pg_catalog.=) o.operation) AS tid) \
             SELECT h.scope, h.operation, h.target, h.key, h.request, h.attempts AS attempt, h.token, \
                    h.locked_until, h.give_up_at \
               FROM handed AS h WHERE h.token IS NOT NULL ORDER BY h.due, h.tid"
        ),
        &[TEXTOID, INT8OID, INTERVALOID, INTERVALOID],
        HANDED_COLUMNS,
    )
}

/// First attempts: pending, never handed out (outbound_first_due_idx).
static FIRST_ATTEMPTS: LazyLock<Forms> = LazyLock::new(|| {
    hand_out("o.state OPERATOR(pg_catalog.=) 'pending' AND o.attempts OPERATOR(pg_catalog.=) 0")
});

/// Retries: handed out before, pending again or whose lease ended (outbound_retry_due_idx).
static RETRIES: LazyLock<Forms> =
    LazyLock::new(|| hand_out(&format!("{LIVE} AND o.attempts OPERATOR(pg_catalog.>) 0")));

static RETRY_DUE: LazyLock<Forms> = LazyLock::new(|| {
    Forms::new(
        &format!(
            "SELECT EXISTS (SELECT FROM idempotency.outbound AS o \
                             WHERE o.target OPERATOR(pg_catalog.=) $1 AND {LIVE} \
                               AND o.attempts OPERATOR(pg_catalog.>) 0 \
                               AND o.next_attempt_at OPERATOR(pg_catalog.<=) pg_catalog.now(){{one}}) AS due"
        ),
        &[TEXTOID],
        &["due"],
    )
});

/// One sender of a target at a time hands out its retries: the same lock as sql/send.sql's.
static TRY_TARGET_LOCK: Statement = Statement {
    sql: "SELECT pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtextextended( \
              'idempotency.outbound_budget ' OPERATOR(pg_catalog.||) $1, 0)) AS locked",
    args: &[TEXTOID],
    kind: Kind::Fresh,
    columns: &["locked"],
};

static TARGET_OF: Statement = Statement {
    sql: "SELECT o.target FROM idempotency.outbound AS o \
          WHERE o.scope OPERATOR(pg_catalog.=) $1 AND o.operation OPERATOR(pg_catalog.=) $2",
    args: &[TEXTOID, TEXTOID],
    kind: Kind::Fresh,
    columns: &["target"],
};

/// The targets with sends not finished, one at a time in order (skipping through the index on
/// give_up_at, whose predicate is LIVE): the first, and the next after $1.
static FIRST_TARGET: LazyLock<Statement> = LazyLock::new(|| Statement {
    sql: format!("SELECT o.target FROM idempotency.outbound AS o WHERE {LIVE} ORDER BY o.target LIMIT 1")
        .leak(),
    args: &[],
    kind: Kind::Fresh,
    columns: &["target"],
});

static NEXT_TARGET: LazyLock<Statement> = LazyLock::new(|| Statement {
    sql: format!(
        "SELECT o.target FROM idempotency.outbound AS o \
          WHERE {LIVE} AND o.target OPERATOR(pg_catalog.>) $1 ORDER BY o.target LIMIT 1"
    )
    .leak(),
    args: &[TEXTOID],
    kind: Kind::Fresh,
    columns: &["target"],
});

/// A send handed out: a row of idem_send_next.
struct Handed {
    scope: String,
    operation: String,
    target: String,
    key: String,
    request: Option<Jsonb>,
    attempt: i32,
    token: Uuid,
    locked_until: TimestampWithTimeZone,
    give_up_at: TimestampWithTimeZone,
}

// The result type is spelled out for #[pg_extern], which reads the column names from it.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_unsafe)]
fn idem_send_next(
    target: default!(Option<&str>, "NULL"),
    max_rows: default!(Option<i32>, 1),
    lease: default!(Option<Interval>, "NULL"),
    scope: default!(Option<&str>, "NULL"),
    operation: default!(Option<&str>, "NULL"),
) -> TableIterator<
    'static,
    (
        name!(scope, String),
        name!(operation, String),
        name!(target, String),
        name!(key, String),
        name!(request, Option<Jsonb>),
        name!(attempt, i32),
        name!(token, Uuid),
        name!(locked_until, TimestampWithTimeZone),
        name!(give_up_at, TimestampWithTimeZone),
    ),
> {
    let rows = send_next(target, max_rows, lease, scope, operation).or_raise();
    TableIterator::new(rows.into_iter().map(|h| {
        (h.scope, h.operation, h.target, h.key, h.request, h.attempt, h.token, h.locked_until, h.give_up_at)
    }))
}

/// What a call is asked for, checked.
struct Ask<'a> {
    target: Option<&'a str>,
    one: Option<(&'a str, &'a str)>,
    lease: Interval,
    ttl: Interval,
}

fn send_next(
    target: Option<&str>,
    max_rows: Option<i32>,
    lease: Option<Interval>,
    scope: Option<&str>,
    operation: Option<&str>,
) -> Result<Vec<Handed>, IdemError> {
    // In sql/send.sql's order, so that a call with several bad arguments names the same one.
    let max_rows = sending::max_rows(max_rows)?;
    let lease = match lease {
        None => settings::default_lease(),
        Some(l) => {
            sending::lease(l.months(), l.days(), l.micros(), || l.to_string())?;
            l
        }
    };
    let target = target.map(|t| validate::key_text("target", Some(t))).transpose()?;
    let one = sending::one_send(scope, operation)?;
    let ask = Ask { target, one, lease, ttl: settings::default_ttl() };
    Ok(Spi::connect_mut(|client| {
        send_budget::write_past(client);
        let mut left = i64::from(max_rows);
        let mut handed = Vec::new();
        let mut current = first_target(client, &ask);
        while let Some(t) = current {
            if left == 0 {
                break;
            }
            left -= take_from(client, &ask, &t, left, &mut handed);
            current = if ask.target.is_none() && ask.one.is_none() { next_target(client, &t) } else { None };
        }
        handed
    }))
}

fn first_target(client: &mut SpiClient<'_>, ask: &Ask<'_>) -> Option<String> {
    match (ask.target, ask.one) {
        (Some(t), _) => Some(t.to_string()),
        (None, Some((scope, operation))) => {
            let row = spi::run(client, &TARGET_OF, &[scope.into(), operation.into()]);
            if row.is_empty() {
                None
            } else {
                get(&row.first(), &TARGET_OF, "target")
            }
        }
        (None, None) => {
            let row = spi::run(client, &FIRST_TARGET, &[]);
            if row.is_empty() {
                None
            } else {
                get(&row.first(), &FIRST_TARGET, "target")
            }
        }
    }
}

fn next_target(client: &mut SpiClient<'_>, after: &str) -> Option<String> {
    let row = spi::run(client, &NEXT_TARGET, &[after.into()]);
    if row.is_empty() {
        None
    } else {
        get(&row.first(), &NEXT_TARGET, "target")
    }
}

/// One target's turn: gives up what is past give_up_at, hands out first attempts, then
/// retries within the budget. Returns how many it handed out (at most `left`).
fn take_from(
    client: &mut SpiClient<'_>,
    ask: &Ask<'_>,
    target: &str,
    left: i64,
    out: &mut Vec<Handed>,
) -> i64 {
    let one = |forms: &'static LazyLock<Forms>| {
        let forms = LazyLock::force(forms);
        if ask.one.is_some() {
            &forms.one
        } else {
            &forms.target
        }
    };
    let with_one = |mut args: Vec<pgrx::datum::DatumWithOid<'static>>| {
        if let Some((scope, operation)) = ask.one {
            args.push(scope.to_string().into());
            args.push(operation.to_string().into());
        }
        args
    };

    spi::run(client, one(&GIVE_UP), &with_one(vec![target.to_string().into(), ask.ttl.into()]));

    let firsts = hand(client, one(&FIRST_ATTEMPTS), with_one(handing(target, left, ask)), out);
    if firsts > 0 {
        send_budget::count(target, Counts { first_attempts: firsts, ..Counts::default() });
    }
    let left = left - firsts;
    if left == 0 {
        return firsts;
    }
    let due = spi::run(client, one(&RETRY_DUE), &with_one(vec![target.to_string().into()])).first();
    if get(&due, one(&RETRY_DUE), "due") != Some(true) {
        return firsts;
    }
    let locked = spi::run(client, &TRY_TARGET_LOCK, &[target.into()]).first();
    if get(&locked, &TRY_TARGET_LOCK, "locked") != Some(true) {
        return firsts;
    }
    let allowance = send_budget::allowance(client, target);
    if allowance <= 0 {
        return firsts;
    }
    let retries = hand(client, one(&RETRIES), with_one(handing(target, left.min(allowance), ask)), out);
    if retries > 0 {
        send_budget::count(target, Counts { retries, ..Counts::default() });
        // Counted at once: the next sender of the target reads the budget with these in it.
        send_budget::write_target(client, target);
    }
    firsts + retries
}

fn handing(target: &str, limit: i64, ask: &Ask<'_>) -> Vec<pgrx::datum::DatumWithOid<'static>> {
    vec![target.to_string().into(), limit.into(), ask.lease.into(), ask.ttl.into()]
}

/// Runs a hand-out statement; its rows go to `out`. Returns how many.
fn hand(
    client: &mut SpiClient<'_>,
    stmt: &'static Statement,
    args: Vec<pgrx::datum::DatumWithOid<'static>>,
    out: &mut Vec<Handed>,
) -> i64 {
    let before = out.len();
    for row in spi::run(client, stmt, &args) {
        out.push(Handed {
            scope: get_not_null(&row, stmt, "scope"),
            operation: get_not_null(&row, stmt, "operation"),
            target: get_not_null(&row, stmt, "target"),
            key: get_not_null(&row, stmt, "key"),
            request: get(&row, stmt, "request"),
            attempt: get_not_null(&row, stmt, "attempt"),
            token: get_not_null(&row, stmt, "token"),
            locked_until: get_not_null(&row, stmt, "locked_until"),
            give_up_at: get_not_null(&row, stmt, "give_up_at"),
        });
    }
    (out.len() - before) as i64
}
