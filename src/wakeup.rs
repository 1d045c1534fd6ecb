//! Waking the claims that wait for a record (idem_claim's `wait`), without polling.
//!
//! A waiting claim holds a transaction-level SHARE lock on an advisory lock tag made from
//! (scope, key), in a lock space of its own (field4 = WAIT_SPACE, which the SQL advisory
//! lock functions never use), and sleeps on its latch. A transaction that changes such a
//! record in a way a waiter cares about (complete, release, the release of a stale claim)
//! notes the tag; when it commits, after its changes became visible, a transaction callback
//! finds the backends holding that tag (GetLockConflicts) and sets their latches. Nobody ever
//! takes the tag in a conflicting mode, so waiters never block each other or anyone else.
//! A wake-up that is missed (or one that is not for us: two keys can share a tag) costs
//! nothing: the waiter also re-reads on a fallback timer (src/api/wait.rs).

use std::cell::{Cell, RefCell};
use std::hash::{DefaultHasher, Hash, Hasher};

use pgrx::pg_sys;
use pgrx::prelude::*;

/// field4 of the tags: 1 and 2 are taken by pg_advisory_lock's two key forms.
const WAIT_SPACE: u16 = 0x1DE0;

thread_local! {
    static PENDING: RefCell<Vec<pg_sys::LOCKTAG>> = const { RefCell::new(Vec::new()) };
    static REGISTERED: Cell<bool> = const { Cell::new(false) };
}

/// The lock tag of (scope, key) in this database.
pub fn tag(scope: &str, key: &str) -> pg_sys::LOCKTAG {
    let mut hasher = DefaultHasher::new();
    (scope, key).hash(&mut hasher);
    let hash = hasher.finish();
    pg_sys::LOCKTAG {
        // SAFETY: a plain read of the backend's database oid.
        locktag_field1: unsafe { pg_sys::MyDatabaseId }.to_u32(),
        locktag_field2: (hash >> 32) as u32,
        locktag_field3: hash as u32,
        locktag_field4: WAIT_SPACE,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    }
}

/// Start listening for commits that change the record of `tag`. False when the lock table
/// has no room for it right now; the caller then relies on its timer alone.
pub fn listen(tag: &pg_sys::LOCKTAG) -> bool {
    // SAFETY: a transaction-level lock in a mode nobody takes in conflict; dontWait, so this
    // never blocks.
    let got = unsafe { pg_sys::LockAcquire(tag, pg_sys::ShareLock as i32, false, true) };
    got != pg_sys::LockAcquireResult::LOCKACQUIRE_NOT_AVAIL
}

/// Stop listening (before the transaction ends, so a long transaction does not keep it).
pub fn stop_listening(tag: &pg_sys::LOCKTAG) {
    // SAFETY: releases the lock taken by `listen` in this transaction.
    unsafe {
        pg_sys::LockRelease(tag, pg_sys::ShareLock as i32, false);
    }
}

/// Wake the claims waiting for (scope, key) once this transaction commits.
pub fn notify_on_commit(scope: &str, key: &str) {
    if !REGISTERED.replace(true) {
        // SAFETY: registered once per backend; the callback lives as long as the library.
        unsafe { pg_sys::RegisterXactCallback(Some(at_transaction_end), std::ptr::null_mut()) };
    }
    PENDING.with(|p| p.borrow_mut().push(tag(scope, key)));
}

#[pg_guard]
unsafe extern "C-unwind" fn at_transaction_end(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
    match event {
        // Runs after ProcArrayEndTransaction: the changes are visible to a new snapshot.
        XACT_EVENT_COMMIT => {
            let tags = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
            for tag in tags {
                // The transaction has committed: nothing may raise an error now.
                PgTryBuilder::new(|| wake_holders(&tag)).catch_others(|_| ()).execute();
            }
        }
        XACT_EVENT_ABORT | XACT_EVENT_PARALLEL_ABORT | XACT_EVENT_PREPARE => {
            PENDING.with(|p| p.borrow_mut().clear());
        }
        _ => {}
    }
}

fn wake_holders(tag: &pg_sys::LOCKTAG) {
    let mut count = 0;
    // SAFETY: GetLockConflicts returns `count` virtual transaction ids (palloc'd, or a
    // static array during recovery); each names a live backend or a prepared transaction.
    unsafe {
        let holders = pg_sys::GetLockConflicts(tag, pg_sys::ExclusiveLock as i32, &mut count);
        for i in 0..count.max(0) as usize {
            let proc = proc_of(*holders.add(i));
            if !proc.is_null() {
                pg_sys::SetLatch(&mut (*proc).procLatch);
            }
        }
    }
}

// How a virtual transaction id names its backend differs by major (as does settings.rs's
// guc_extra). Suites build and run 15 and 18 only (docs/versions.md); the arms for 13, 14,
// 16 and 17 follow pgrx's bindings but nothing here builds them.
#[cfg(any(feature = "pg13", feature = "pg14", feature = "pg15", feature = "pg16"))]
unsafe fn proc_of(vxid: pg_sys::VirtualTransactionId) -> *mut pg_sys::PGPROC {
    extern "C-unwind" {
        fn BackendIdGetProc(backend_id: std::ffi::c_int) -> *mut pg_sys::PGPROC;
    }
    BackendIdGetProc(vxid.backendId)
}

#[cfg(any(feature = "pg17", feature = "pg18"))]
unsafe fn proc_of(vxid: pg_sys::VirtualTransactionId) -> *mut pg_sys::PGPROC {
    pg_sys::ProcNumberGetProc(vxid.procNumber)
}
