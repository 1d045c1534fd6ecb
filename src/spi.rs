//! Statements prepared once per backend and kept, and the few values every path needs.
//!
//! A `Read` statement runs read-only while the transaction has no transaction id, so
//! answering from a read writes nothing and assigns none. A `Write` statement always runs
//! with a fresh snapshot, which is what lets a claim that waited on the unique index see
//! the row that the other transaction committed.
//!
//! Every statement names its schema and qualifies its operators (`OPERATOR(pg_catalog.=)`),
//! so nothing on the caller's search_path can change what it does.

use std::cell::RefCell;
use std::collections::HashMap;

use pgrx::datum::{DatumWithOid, TimestampWithTimeZone, Uuid};
use pgrx::pg_sys::{self, PgOid};
use pgrx::spi::{OwnedPreparedStatement, SpiClient, SpiHeapTupleData, SpiResult, SpiTupleTable};
use pgrx::{FromDatum, IntoDatum};

use crate::errors::IdemError;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Read,
    /// Takes a transaction id before it runs (pgrx's `update`), so that the statements after
    /// it run with fresh snapshots too.
    Write,
    /// A queue's statement (the sending side): runs with a fresh snapshot, as a statement of a
    /// VOLATILE PL/pgSQL function does, takes a transaction id only if it writes or locks a row
    /// (most polls find nothing), and always runs its generic plan. These statements are
    /// written for their indexes; with a `LIMIT $n` the planner prices the generic plan above
    /// a custom one and would plan again at every call, which costs more than the run.
    Fresh,
}

pub struct Statement {
    pub sql: &'static str,
    pub args: &'static [pg_sys::Oid],
    pub kind: Kind,
    /// The result's columns in order, as the SQL names them: `get` reads a column by its
    /// name from here, without asking SPI. Checked against the result the first time the
    /// statement runs in a backend.
    pub columns: &'static [&'static str],
}

thread_local! {
    // Plans live as long as the backend, so they are leaked on purpose: a plain reference
    // can then be used without holding a borrow while the statement runs.
    static PLANS: RefCell<HashMap<usize, &'static OwnedPreparedStatement>> = RefCell::new(HashMap::new());
}

/// Runs `stmt` with `args`; the plan is prepared on first use in this backend and kept.
pub fn run<'conn>(
    client: &mut SpiClient<'conn>,
    stmt: &'static Statement,
    args: &[DatumWithOid<'_>],
) -> SpiTupleTable<'conn> {
    let id = stmt as *const Statement as usize;
    let (plan, fresh) = match PLANS.with(|plans| plans.borrow().get(&id).copied()) {
        Some(plan) => (plan, false),
        None => {
            let types: Vec<PgOid> = stmt.args.iter().map(|&oid| PgOid::from(oid)).collect();
            let prepared = match stmt.kind {
                Kind::Read => client.prepare(stmt.sql, &types),
                Kind::Write | Kind::Fresh => client.prepare_mut(stmt.sql, &types),
            }
            .unwrap_or_else(|e| panic!("preparing an idempotency statement failed: {e}"));
            let plan: &'static OwnedPreparedStatement = Box::leak(Box::new(prepared.keep()));
            PLANS.with(|plans| plans.borrow_mut().insert(id, plan));
            (plan, true)
        }
    };
    let result = match stmt.kind {
        Kind::Read => client.select(plan, None, args),
        // A statement prepared as mutating runs read-write (a fresh snapshot) either way.
        Kind::Fresh => {
            let _generic = GenericPlan::force();
            client.select(plan, None, args)
        }
        Kind::Write => client.update(plan, None, args),
    };
    let result = result.unwrap_or_else(|e| panic!("an idempotency statement failed: {e}"));
    if fresh {
        let names: Vec<String> = match result.columns() {
            Ok(n) => (1..=n).map(|i| result.column_name(i).unwrap_or_default()).collect(),
            Err(_) => Vec::new(), // no result rows at all (DML without RETURNING)
        };
        assert_eq!(names, stmt.columns, "the columns of {}", stmt.sql);
    }
    result
}

/// plan_cache_mode = force_generic_plan while it lives (GetCachedPlan reads the variable),
/// then back to what it was, also when the statement raises an error (pgrx unwinds through
/// Rust frames). Nothing the statement calls plans anything: no user function is called.
struct GenericPlan(std::ffi::c_int);

impl GenericPlan {
    fn force() -> GenericPlan {
        // SAFETY: a GUC variable of the backend's only thread, restored by Drop.
        unsafe {
            let was = pg_sys::plan_cache_mode;
            pg_sys::plan_cache_mode =
                pg_sys::PlanCacheMode::PLAN_CACHE_MODE_FORCE_GENERIC_PLAN as std::ffi::c_int;
            GenericPlan(was)
        }
    }
}

impl Drop for GenericPlan {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { pg_sys::plan_cache_mode = self.0 };
    }
}

/// A row of a result: its current row (`SpiTupleTable`), or a row taken from it while
/// iterating (`SpiHeapTupleData`).
pub trait Columns {
    /// Column `n`, 1-based.
    fn at<T: FromDatum + IntoDatum>(&self, n: usize) -> SpiResult<Option<T>>;
}

impl Columns for SpiTupleTable<'_> {
    fn at<T: FromDatum + IntoDatum>(&self, n: usize) -> SpiResult<Option<T>> {
        self.get(n)
    }
}

impl Columns for SpiHeapTupleData<'_> {
    fn at<T: FromDatum + IntoDatum>(&self, n: usize) -> SpiResult<Option<T>> {
        self.get(n)
    }
}

/// Where column `name` is in the result of `stmt` (1-based).
fn ordinal(stmt: &Statement, name: &str) -> usize {
    match stmt.columns.iter().position(|c| *c == name) {
        Some(i) => i + 1,
        None => panic!("no column {name} in the result of {}", stmt.sql),
    }
}

/// Column `name` of `row`, a row of `stmt`'s result, copied out of SPI's memory.
pub fn get<T: FromDatum + IntoDatum>(row: &impl Columns, stmt: &Statement, name: &str) -> Option<T> {
    row.at(ordinal(stmt, name)).unwrap_or_else(|e| panic!("reading column {name} failed: {e}"))
}

/// Column `name` of `row`, a row of `stmt`'s result, which the table declares NOT NULL.
pub fn get_not_null<T: FromDatum + IntoDatum>(row: &impl Columns, stmt: &Statement, name: &str) -> T {
    get(row, stmt, name).unwrap_or_else(|| panic!("{name} is NOT NULL"))
}

/// Column `name` of the current row of `stmt`'s result as the datum SPI holds, typed as the
/// column is: for passing a value from one statement to the next inside the same SPI
/// connection.
pub fn get_datum<'conn>(
    table: &SpiTupleTable<'conn>,
    stmt: &Statement,
    name: &str,
) -> Option<DatumWithOid<'conn>> {
    let n = ordinal(stmt, name);
    let datum =
        table.get_datum_by_ordinal(n).unwrap_or_else(|e| panic!("reading column {name} failed: {e}"))?;
    let oid = table.column_type_oid(n).unwrap_or_else(|e| panic!("typing column {name} failed: {e}"));
    // SAFETY: the datum and its type come from the same column of SPI's current tuple table,
    // which lives until SPI_finish.
    Some(unsafe { DatumWithOid::new(datum, oid.value()) })
}

/// How many rows the last statement inserted, updated or deleted.
pub fn processed() -> u64 {
    // SAFETY: read right after the statement, on the backend's only thread.
    unsafe { pg_sys::SPI_processed }
}

/// The transaction's start time, `now()` in SQL. Every expiry and lease compares with it.
pub fn now() -> TimestampWithTimeZone {
    pgrx::datum::now()
}

/// A fresh random (version 4) uuid: a claim's fencing token.
pub fn new_token() -> Uuid {
    let mut bytes = [0u8; 16];
    // SAFETY: writes exactly 16 bytes into the buffer.
    let ok = unsafe { pg_sys::pg_strong_random(bytes.as_mut_ptr().cast(), bytes.len()) };
    assert!(ok, "could not generate random bytes for a token");
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    Uuid::from_bytes(bytes)
}

/// Write functions refuse to run on a hot standby, with their own clear error, before
/// they read anything.
pub fn require_primary(function: &'static str) -> Result<(), IdemError> {
    // SAFETY: a plain read of shared recovery state.
    if unsafe { pg_sys::RecoveryInProgress() } {
        return Err(IdemError::ReadOnlyServer { function });
    }
    Ok(())
}
