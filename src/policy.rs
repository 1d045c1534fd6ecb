//! Row-level security and the key lock (docs/security.md). A claim of a key in a scope whose
//! INSERT policy refuses the current role must fail with 42501 at once, as the INSERT does,
//! even while another tenant's transaction holds that key: waiting for the key's lock first
//! would make it wait (and tell it that the key is held). So where row-level security applies
//! to the current role, a claim that would wait for the lock, or hold the key without writing
//! it (`deferred`), first checks the policy by a trial write: the row is inserted in a
//! subtransaction that is always rolled back (42501 passes through; anything else the trial
//! meets is left to the real write).

use pgrx::pg_sys;
use pgrx::prelude::*;

/// Does row-level security apply to the current role on `idempotency.<table>`?
pub fn applies(table: &std::ffi::CStr) -> bool {
    // SAFETY: catalog look-ups by name; check_enable_rls with noError answers, never raises.
    unsafe {
        let namespace = pg_sys::get_namespace_oid(c"idempotency".as_ptr(), true);
        if namespace == pg_sys::InvalidOid {
            return false;
        }
        let relid = pg_sys::get_relname_relid(table.as_ptr(), namespace);
        relid != pg_sys::InvalidOid
            && pg_sys::check_enable_rls(relid, pg_sys::InvalidOid, true)
                == pg_sys::CheckEnableRlsResult::RLS_ENABLED as i32
    }
}

/// Runs `write` in a subtransaction that is rolled back whatever happens; an error of
/// SQLSTATE 42501 (the policy refused the row) is raised again, any other is dropped.
pub fn trial(write: impl FnOnce()) {
    // After an error the subtransaction is rolled back and nothing `write` touched is read
    // again but through SPI, which the rollback left consistent.
    let write = std::panic::AssertUnwindSafe(write);
    // SAFETY: the subtransaction is begun and ended here, the caller's memory context and
    // resource owner restored after it, as PL/pgSQL does around an exception block.
    let refused = unsafe {
        let context = pg_sys::CurrentMemoryContext;
        let owner = pg_sys::CurrentResourceOwner;
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        pg_sys::MemoryContextSwitchTo(context);
        let outcome = PgTryBuilder::new(move || {
            write();
            None
        })
        .catch_others(Some)
        .execute();
        pg_sys::RollbackAndReleaseCurrentSubTransaction();
        pg_sys::MemoryContextSwitchTo(context);
        pg_sys::CurrentResourceOwner = owner;
        outcome.filter(|caught| match caught {
            pg_sys::panic::CaughtError::PostgresError(report)
            | pg_sys::panic::CaughtError::ErrorReport(report) => {
                report.sql_error_code() == PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE
            }
            pg_sys::panic::CaughtError::RustPanic { .. } => false,
        })
    };
    if let Some(caught) = refused {
        caught.rethrow();
    }
}
