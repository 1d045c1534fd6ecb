//! The retry budget's counts of this backend (src/budget_ledger.rs says what is kept and
//! when it is written) and the statements that write them to idempotency.outbound_budget:
//! rows of this backend's own (backend_pid), so that writing never waits for a lock.

use std::cell::{Cell, RefCell};

use pgrx::datum::{Interval, TimestampWithTimeZone};
use pgrx::pg_sys::{self, INTERVALOID, TEXTARRAYOID, TEXTOID};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

use crate::budget_ledger::{Counts, Ledger, Slot};
use crate::spi::{self, get, Kind, Statement};
use crate::{sending, settings};

thread_local! {
    static LEDGER: RefCell<Ledger> = RefCell::new(Ledger::default());
    static REGISTERED: Cell<bool> = const { Cell::new(false) };
}

fn current_subtransaction() -> u32 {
    // SAFETY: a plain read of the transaction state.
    unsafe { pg_sys::GetCurrentSubTransactionId() }
}

/// The start of now()'s bucket (microseconds since 2000-01-01).
fn bucket_now() -> i64 {
    let window = settings::send_retry_window();
    let width = sending::bucket_width(window.days(), window.micros());
    sending::bucket_of(pg_sys::TimestampTz::from(spi::now()), width)
}

/// Counts, for `target`, what this call handed out or recorded. Kept until it is written.
pub(super) fn count(target: &str, counts: Counts) {
    if !REGISTERED.replace(true) {
        // SAFETY: registered once per backend; the callbacks live as long as the library.
        unsafe {
            pg_sys::RegisterXactCallback(Some(at_transaction_end), std::ptr::null_mut());
            pg_sys::RegisterSubXactCallback(Some(at_subtransaction_end), std::ptr::null_mut());
        }
    }
    LEDGER
        .with(|l| l.borrow_mut().count(current_subtransaction(), (target.to_string(), bucket_now()), counts));
}

/// Writes the counts of committed transactions that wait in buckets already over: in a
/// backend that keeps sending, once a bucket.
pub(super) fn write_past(client: &mut SpiClient<'_>) {
    let now = bucket_now();
    let due = LEDGER.with(|l| {
        let l = l.borrow();
        if l.waiting_before(now) {
            l.unwritten(|slot| slot.1 < now)
        } else {
            Vec::new()
        }
    });
    write(client, due);
}

/// Writes everything counted for `target` and not written yet: before its budget is read, and
/// right after a count that holds retries back.
pub(super) fn write_target(client: &mut SpiClient<'_>, target: &str) {
    let due = LEDGER.with(|l| l.borrow().unwritten(|slot| slot.0 == target));
    write(client, due);
}

/// Adds counts to this backend's rows, one per target and bucket ($1 targets, $2 buckets, $3
/// to $6 the four counts, element by element).
static WRITE: Statement = Statement {
    sql: "INSERT INTO idempotency.outbound_budget AS b \
                 (target, bucket, backend_pid, first_attempts, retries, final_answers, retryable_answers) \
          SELECT c.target, c.bucket, pg_catalog.pg_backend_pid(), c.f, c.r, c.fa, c.ra \
            FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3), \
                           pg_catalog.unnest($4), pg_catalog.unnest($5), pg_catalog.unnest($6)) \
                 AS c(target, bucket, f, r, fa, ra) \
          ON CONFLICT ON CONSTRAINT outbound_budget_pkey DO UPDATE \
             SET first_attempts = b.first_attempts OPERATOR(pg_catalog.+) excluded.first_attempts, \
                 retries = b.retries OPERATOR(pg_catalog.+) excluded.retries, \
                 final_answers = b.final_answers OPERATOR(pg_catalog.+) excluded.final_answers, \
                 retryable_answers = b.retryable_answers OPERATOR(pg_catalog.+) excluded.retryable_answers",
    args: &[
        TEXTARRAYOID,
        pg_sys::TIMESTAMPTZARRAYOID,
        pg_sys::INT8ARRAYOID,
        pg_sys::INT8ARRAYOID,
        pg_sys::INT8ARRAYOID,
        pg_sys::INT8ARRAYOID,
    ],
    kind: Kind::Write,
    columns: &[],
};

/// Deletes the rows of the targets $1 older than $2 (two windows, at least two minutes) before
/// now(), skipping rows a session holds (as sql/send.sql's send_count and send_sweep).
static DELETE_OLD: Statement = Statement {
    sql: "DELETE FROM idempotency.outbound_budget AS b \
           USING (SELECT o.target, o.bucket, o.backend_pid FROM idempotency.outbound_budget AS o \
                   WHERE o.target OPERATOR(pg_catalog.=) ANY ($1) \
                     AND o.bucket OPERATOR(pg_catalog.<) (pg_catalog.now() OPERATOR(pg_catalog.-) $2) \
                     FOR UPDATE SKIP LOCKED) AS old \
          WHERE b.target OPERATOR(pg_catalog.=) old.target AND b.bucket OPERATOR(pg_catalog.=) old.bucket \
            AND b.backend_pid OPERATOR(pg_catalog.=) old.backend_pid",
    args: &[TEXTARRAYOID, INTERVALOID],
    kind: Kind::Write,
    columns: &[],
};

/// How long a budget row is kept: two windows, at least two minutes.
fn kept() -> Interval {
    let window = settings::send_retry_window();
    if window.as_micros() < 60_000_000 {
        return Interval::from_minutes(2);
    }
    Interval::new(0, 2 * window.days(), 2 * window.micros()).unwrap_or(window)
}

fn write(client: &mut SpiClient<'_>, due: Vec<(Slot, Counts)>) {
    if due.is_empty() {
        return;
    }
    let targets: Vec<&str> = due.iter().map(|((t, _), _)| t.as_str()).collect();
    let buckets: Vec<TimestampWithTimeZone> = due
        .iter()
        .map(|((_, b), _)| {
            TimestampWithTimeZone::try_from(*b).expect("a bucket of now() is a valid timestamp")
        })
        .collect();
    let column = |f: fn(&Counts) -> i64| due.iter().map(|(_, c)| f(c)).collect::<Vec<i64>>();
    spi::run(
        client,
        &WRITE,
        &[
            targets.clone().into(),
            buckets.into(),
            column(|c| c.first_attempts).into(),
            column(|c| c.retries).into(),
            column(|c| c.final_answers).into(),
            column(|c| c.retryable_answers).into(),
        ],
    );
    let mut distinct = targets;
    distinct.dedup();
    spi::run(client, &DELETE_OLD, &[distinct.into(), kept().into()]);
    LEDGER.with(|l| l.borrow_mut().written(current_subtransaction(), &due));
}

/// The retries `target` may be handed out now: sql/send.sql's send_retry_allowance (the one
/// place the budget's arithmetic is written), after this backend's counts of it are written.
pub(super) fn allowance(client: &mut SpiClient<'_>, target: &str) -> i64 {
    write_target(client, target);
    let row = spi::run(client, &ALLOWANCE, &[target.into()]).first();
    get::<i64>(&row, &ALLOWANCE, "allowed").unwrap_or(0)
}

static ALLOWANCE: Statement = Statement {
    sql: "SELECT idempotency.send_retry_allowance($1) AS allowed",
    args: &[TEXTOID],
    // Not Fresh: the PL/pgSQL function plans its own statements.
    kind: Kind::Write,
    columns: &["allowed"],
};

#[pg_guard]
unsafe extern "C-unwind" fn at_transaction_end(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
    match event {
        // A prepared transaction's counts are kept as committed ones: if it is rolled back
        // later, the budget counted a few first attempts or answers too many or too few.
        XACT_EVENT_COMMIT | XACT_EVENT_PARALLEL_COMMIT | XACT_EVENT_PREPARE => {
            LEDGER.with(|l| l.borrow_mut().transaction_committed())
        }
        XACT_EVENT_ABORT | XACT_EVENT_PARALLEL_ABORT => LEDGER.with(|l| l.borrow_mut().transaction_aborted()),
        _ => {}
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn at_subtransaction_end(
    event: pg_sys::SubXactEvent::Type,
    subtransaction: pg_sys::SubTransactionId,
    parent: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    use pg_sys::SubXactEvent::*;
    match event {
        SUBXACT_EVENT_ABORT_SUB => LEDGER.with(|l| l.borrow_mut().subtransaction_aborted(subtransaction)),
        SUBXACT_EVENT_COMMIT_SUB => {
            LEDGER.with(|l| l.borrow_mut().subtransaction_committed(subtransaction, parent))
        }
        _ => {}
    }
}
