//! idem_claim's `wait`: a claim that would answer `in_progress` waits for the owner's
//! record to change, then answers as a claim made at that moment would.
//!
//! While it waits it holds no row lock and no transaction id: it re-reads the record with a
//! fresh snapshot (READ COMMITTED) each time it wakes. It wakes when a transaction that
//! completed or released the record commits (src/wakeup.rs), when the owner's lease or the
//! record ends, when `wait` runs out, and at the latest every FALLBACK_POLL_MS (for changes
//! made without the functions, or a wake-up missed). Cancel and statement_timeout interrupt
//! the sleep like any other.

use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys;

use crate::api::claim_result::Answer;
use crate::errors::IdemError;
use crate::record::Outcome;
use crate::wakeup;

/// Longest sleep between two re-reads, in milliseconds.
const FALLBACK_POLL_MS: i64 = 500;

/// Under REPEATABLE READ or SERIALIZABLE the transaction's snapshot never shows the change:
/// those claims answer at once.
pub fn can_wait() -> bool {
    // SAFETY: a plain read of the transaction's isolation level.
    unsafe { pg_sys::XactIsoLevel < pg_sys::XACT_REPEATABLE_READ as i32 }
}

/// Called after a claim of (scope, key) answered `in_progress`: waits up to `wait_micros`
/// for the record to change; `claim_at(now)` claims again as of `now`.
pub fn until_changed(
    scope: &str,
    key: &str,
    wait_micros: i64,
    mut claim_at: impl FnMut(TimestampWithTimeZone) -> Result<Answer, IdemError>,
) -> Result<Answer, IdemError> {
    let deadline = clock().saturating_add(wait_micros);
    let tag = wakeup::tag(scope, key);
    let listening = wakeup::listen(&tag);
    // The first read happened before we listened: read once more before sleeping, so a
    // commit in between is not missed.
    let answer = loop {
        let now = clock();
        let answer = with_fresh_snapshot(|| claim_at(at(now)))?;
        if answer.outcome != Outcome::InProgress || now >= deadline {
            break answer;
        }
        let mut wake_at = deadline.min(now + FALLBACK_POLL_MS * 1000);
        for end in [answer.locked_until, answer.expires_at].into_iter().flatten() {
            wake_at = wake_at.min(pg_sys::TimestampTz::from(end));
        }
        sleep_ms(((wake_at - now) + 999) / 1000);
    };
    if listening {
        wakeup::stop_listening(&tag);
    }
    Ok(answer)
}

fn clock() -> pg_sys::TimestampTz {
    // SAFETY: reads the system clock.
    unsafe { pg_sys::GetCurrentTimestamp() }
}

fn at(raw: pg_sys::TimestampTz) -> TimestampWithTimeZone {
    TimestampWithTimeZone::try_from(raw).expect("the clock is inside the timestamp range")
}

/// Runs `f` with a new snapshot (READ COMMITTED: one that sees every commit so far).
fn with_fresh_snapshot<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: pushed and popped around `f`; on an error the transaction's abort unwinds the
    // active snapshot stack.
    unsafe { pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot()) };
    let result = f();
    unsafe { pg_sys::PopActiveSnapshot() };
    result
}

/// Sleeps on the latch for up to `ms` (at least 1), then serves any cancel or timeout.
fn sleep_ms(ms: i64) {
    let events = (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32;
    // SAFETY: the backend's own latch; WaitLatch returns on a wake-up, a timeout or a signal.
    unsafe {
        pg_sys::WaitLatch(pg_sys::MyLatch, events, ms.max(1), pg_sys::PG_WAIT_EXTENSION);
        pg_sys::ResetLatch(pg_sys::MyLatch);
    }
    pgrx::check_for_interrupts!();
}
