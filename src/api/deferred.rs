//! Deferred claims: `idem_claim(..., deferred => true)` of a free key writes nothing. The key
//! is held by its key lock (src/keylock.rs) and by this module's memory until the transaction
//! ends; `idem_complete` then writes the completed record with one INSERT, and
//! `idem_checkpoint` / `idem_release` change only this memory. A transaction that commits a
//! deferred claim it did not complete or release writes its `in_progress` record at COMMIT
//! (PREPARE TRANSACTION too), just before the commit, exactly as a claim without `deferred`
//! would have left it: the committed-first pattern keeps its lease and token.
//!
//! What is held follows the transaction: a subtransaction that rolls back takes back the
//! claims, completes, checkpoints and releases made in it (the key lock it took goes with it
//! too); a subtransaction that commits hands them to its parent. Each key keeps a stack of
//! versions, one per change, labelled with the subtransaction that made it.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use pgrx::datum::{Interval, TimestampWithTimeZone, Uuid};
use pgrx::heap_tuple::PgHeapTuple;
use pgrx::pg_sys::{self, SubTransactionId};
use pgrx::prelude::*;
use pgrx::{AllocatedByRust, IntoDatum};

use crate::api::stored::Record;
use crate::api::write::{self, NewRecord};
use crate::errors::IdemError;
use crate::jsonb::Jsonb;
use crate::record::Status;

/// A deferred claim as it stands: an `in_progress` record not yet written.
#[derive(Clone)]
pub(super) struct Claim {
    pub(super) token: Uuid,
    pub(super) fingerprint: Option<String>,
    /// now() of the claim.
    pub(super) claimed_at: TimestampWithTimeZone,
    pub(super) expires_at: TimestampWithTimeZone,
    pub(super) locked_until: TimestampWithTimeZone,
    /// The length of its lease (a checkpoint without a lease renews it by this much).
    pub(super) lease: Interval,
    /// The token of the expired record the claim replaces, if there was one.
    pub(super) replaces: Option<Uuid>,
    pub(super) recovery_point: Option<String>,
    pub(super) recovery_data: Option<Jsonb>,
}

/// The versions of one key's deferred claim, oldest first; None: completed or released.
type Versions = Vec<(SubTransactionId, Option<Claim>)>;

thread_local! {
    static HELD: RefCell<HashMap<(String, String), Versions>> = RefCell::new(HashMap::new());
    static REGISTERED: Cell<bool> = const { Cell::new(false) };
}

fn current_subtransaction() -> SubTransactionId {
    // SAFETY: a plain read of the transaction state.
    unsafe { pg_sys::GetCurrentSubTransactionId() }
}

fn push(scope: &str, key: &str, version: Option<Claim>) {
    if !REGISTERED.replace(true) {
        // SAFETY: registered once per backend; the callbacks live as long as the library.
        unsafe {
            pg_sys::RegisterXactCallback(Some(at_transaction_end), std::ptr::null_mut());
            pg_sys::RegisterSubXactCallback(Some(at_subtransaction_end), std::ptr::null_mut());
        }
    }
    let at = current_subtransaction();
    HELD.with(|held| {
        held.borrow_mut().entry((scope.to_string(), key.to_string())).or_default().push((at, version));
    });
}

/// The deferred claim of (scope, key) this transaction holds now, if any.
fn current(scope: &str, key: &str) -> Option<Claim> {
    HELD.with(|held| {
        held.borrow()
            .get(&(scope.to_string(), key.to_string()))
            .and_then(|v| v.last())
            .and_then(|(_, c)| c.clone())
    })
}

/// The row of idempotency.keys a deferred claim of (scope, key) will write, if this
/// transaction holds one (for idem_lookup).
pub(super) fn held_row(scope: &str, key: &str) -> Option<PgHeapTuple<'static, AllocatedByRust>> {
    fn set<T: IntoDatum>(row: &mut PgHeapTuple<'static, AllocatedByRust>, name: &str, value: T) {
        row.set_by_name(name, value).unwrap_or_else(|e| panic!("column {name} of idempotency.keys: {e}"));
    }
    let claim = current(scope, key)?;
    let r = claim.record(scope, key, None);
    let mut row =
        PgHeapTuple::new_composite_type("idempotency.keys").expect("idempotency.keys is a row type");
    set(&mut row, "scope", r.scope);
    set(&mut row, "key", r.key);
    set(&mut row, "fingerprint", r.fingerprint);
    set(&mut row, "status", r.status.as_str());
    set(&mut row, "token", r.token);
    set(&mut row, "attempts", r.attempts);
    set(&mut row, "locked_until", r.locked_until);
    set(&mut row, "recovery_point", r.recovery_point);
    set(&mut row, "recovery_data", r.recovery_data);
    set(&mut row, "created_at", r.created_at);
    set(&mut row, "updated_at", r.updated_at);
    set(&mut row, "expires_at", r.expires_at);
    Some(row)
}

impl Claim {
    /// The record the claim writes: `in_progress`, or `completed` with the response `done`.
    pub(super) fn record<'a>(
        &'a self,
        scope: &'a str,
        key: &'a str,
        done: Option<Completion>,
    ) -> NewRecord<'a> {
        let (status, locked_until, completed_at, response) = match done {
            None => (Status::InProgress, Some(self.locked_until), None, (None, None, None)),
            Some(done) => {
                (Status::Completed, None, Some(done.at), (Some(done.status), done.headers, done.body))
            }
        };
        NewRecord {
            scope,
            key,
            fingerprint: self.fingerprint.as_deref(),
            status,
            token: self.token,
            attempts: 1,
            locked_until,
            recovery_point: self.recovery_point.as_deref(),
            recovery_data: self.recovery_data,
            response_status: response.0,
            response_headers: response.1,
            response_body: response.2,
            created_at: self.claimed_at,
            updated_at: completed_at.unwrap_or(self.claimed_at),
            completed_at,
            expires_at: self.expires_at,
        }
    }
}

/// This transaction now holds `claim` of (scope, key) without writing it.
pub(super) fn hold(scope: &str, key: &str, mut claim: Claim) {
    claim.recovery_data = claim.recovery_data.map(Jsonb::copy_for_transaction);
    push(scope, key, Some(claim));
}

/// The record a deferred claim of (scope, key) stands for, as a read of the table would
/// find it once written.
pub(super) fn record(scope: &str, key: &str) -> Option<Record> {
    current(scope, key).map(|c| Record {
        fingerprint: c.fingerprint,
        status: Status::InProgress,
        token: c.token,
        attempts: 1,
        locked_until: Some(c.locked_until),
        expires_at: c.expires_at,
        response_status: None,
        response_headers: None,
        response_body: None,
        recovery_point: c.recovery_point,
        recovery_data: c.recovery_data,
    })
}

/// A response to store.
pub(super) struct Completion {
    pub(super) status: i32,
    pub(super) headers: Option<Jsonb>,
    pub(super) body: Option<Jsonb>,
    /// now()
    pub(super) at: TimestampWithTimeZone,
}

/// idem_complete of a deferred claim: None when this transaction holds none for the key
/// (the record, if any, is in the table).
pub(super) fn complete(
    scope: &str,
    key: &str,
    token: Uuid,
    done: Completion,
) -> Option<Result<(), IdemError>> {
    let claim = current(scope, key)?;
    if claim.token != token {
        return Some(Err(IdemError::NotOwner { scope: scope.to_string(), key: key.to_string() }));
    }
    Spi::connect_mut(|client| write::create(client, &claim.record(scope, key, Some(done)), claim.replaces));
    push(scope, key, None);
    Some(Ok(()))
}

/// idem_checkpoint of a deferred claim (None: none held): records the checkpoint and renews
/// the lease by `lease`, or by the claim's own lease length; returns the new end of the lease.
pub(super) fn checkpoint(
    scope: &str,
    key: &str,
    token: Uuid,
    recovery_point: &str,
    recovery_data: Option<Jsonb>,
    lease: Option<Interval>,
    now: TimestampWithTimeZone,
) -> Option<Result<TimestampWithTimeZone, IdemError>> {
    let mut claim = current(scope, key)?;
    if claim.token != token {
        return Some(Err(IdemError::NotOwner { scope: scope.to_string(), key: key.to_string() }));
    }
    claim.recovery_point = Some(recovery_point.to_string());
    claim.recovery_data = recovery_data;
    claim.locked_until = now + lease.unwrap_or(claim.lease);
    let locked_until = claim.locked_until;
    hold(scope, key, claim);
    Some(Ok(locked_until))
}

/// idem_release of a deferred claim (None: none held): true when `token` held it.
pub(super) fn release(scope: &str, key: &str, token: Uuid) -> Option<bool> {
    let claim = current(scope, key)?;
    if claim.token != token {
        return Some(false);
    }
    push(scope, key, None);
    Some(true)
}

/// Writes the `in_progress` record of every deferred claim still held: a transaction that
/// commits (or prepares) them without completing them.
fn write_held() {
    let held: Vec<((String, String), Claim)> = HELD.with(|held| {
        held.borrow()
            .iter()
            .filter_map(|(k, v)| v.last().and_then(|(_, c)| c.clone()).map(|c| (k.clone(), c)))
            .collect()
    });
    if held.is_empty() {
        return;
    }
    // At COMMIT no statement is running: the writes need a snapshot of their own.
    // SAFETY: pushed here and popped below; an error's abort unwinds the stack.
    unsafe { pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot()) };
    Spi::connect_mut(|client| {
        for ((scope, key), claim) in &held {
            write::create(client, &claim.record(scope, key, None), claim.replaces);
        }
    });
    unsafe { pg_sys::PopActiveSnapshot() };
}

#[pg_guard]
unsafe extern "C-unwind" fn at_transaction_end(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
    match event {
        XACT_EVENT_PRE_COMMIT | XACT_EVENT_PRE_PREPARE => write_held(),
        XACT_EVENT_COMMIT | XACT_EVENT_ABORT | XACT_EVENT_PREPARE | XACT_EVENT_PARALLEL_ABORT => {
            HELD.with(|held| held.borrow_mut().clear());
        }
        _ => {}
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn at_subtransaction_end(
    event: pg_sys::SubXactEvent::Type,
    subtransaction: SubTransactionId,
    parent: SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    use pg_sys::SubXactEvent::*;
    match event {
        SUBXACT_EVENT_ABORT_SUB => HELD.with(|held| {
            let mut held = held.borrow_mut();
            for versions in held.values_mut() {
                versions.retain(|(at, _)| *at != subtransaction);
            }
            held.retain(|_, versions| !versions.is_empty());
        }),
        SUBXACT_EVENT_COMMIT_SUB => HELD.with(|held| {
            for versions in held.borrow_mut().values_mut() {
                for (at, _) in versions.iter_mut() {
                    if *at == subtransaction {
                        *at = parent;
                    }
                }
            }
        }),
        _ => {}
    }
}
