//! The direct read: the look-up that idem_claim (keys by scope and key) and idem_seen
//! (messages by scope and message_id) start with reads the primary-key index and the heap
//! itself, under the statement's snapshot, instead of running a prepared statement through
//! SPI's executor. It is taken only when it answers exactly what the statement would; that is
//! checked on every call (`open`), and otherwise the caller runs its statement through SPI.
//! docs/operations.md#read-paths says when, and how to see which path a call took.
//!
//! The read is the statement's: the same snapshot (the active one, as a read-only SPI
//! statement uses), the same lock (AccessShareLock on the table and the index), the same
//! privilege check (SELECT on the table for the current user), the same index probe with
//! the column's collation. What the statement would do differently goes through SPI: a table
//! with row-level security, rules, another kind or access method, a primary key that is not
//! (scope, id) of text with the default operators, a missing column, a role without
//! table-wide SELECT (SPI then raises the 42501, or reads what column privileges allow), an
//! ExecutorCheckPerms_hook (sepgsql, pgaudit), Citus (whose distributed tables are shells here).

use std::cell::OnceCell;
use std::ffi::CStr;
use std::fmt;

use pgrx::pg_sys::{self, Datum, Oid};
use pgrx::spi::SpiResult;
use pgrx::{FromDatum, IntoDatum};

use crate::settings;
use crate::spi::Columns;

/// A table of the extension read by its primary key (scope, id).
#[derive(Clone, Copy)]
pub enum Table {
    Keys,
    Messages,
}

impl Table {
    fn name(self) -> &'static CStr {
        match self {
            Table::Keys => c"keys",
            Table::Messages => c"messages",
        }
    }

    /// The primary key's second column.
    fn id_column(self) -> &'static str {
        match self {
            Table::Keys => "key",
            Table::Messages => "message_id",
        }
    }
}

/// Why a read went through SPI.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ThroughSpi {
    Setting,
    Citus,
    PermissionsHook,
    NoSnapshot,
    NoTable,
    NoSelectPrivilege,
    NotPlainHeapTable,
    RowLevelSecurity,
    Rules,
    KeyNotScopeAndId,
    ColumnMissing,
}

impl fmt::Display for ThroughSpi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ThroughSpi::Setting => "idempotency.direct_read is off",
            ThroughSpi::Citus => "Citus is loaded (shared_preload_libraries)",
            ThroughSpi::PermissionsHook => "an ExecutorCheckPerms_hook is installed",
            ThroughSpi::NoSnapshot => "there is no active snapshot",
            ThroughSpi::NoTable => "the table is not there",
            ThroughSpi::NoSelectPrivilege => "the current user has no SELECT on the whole table",
            ThroughSpi::NotPlainHeapTable => "it is not a plain heap table",
            ThroughSpi::RowLevelSecurity => "row-level security is enabled on it",
            ThroughSpi::Rules => "it has rules",
            ThroughSpi::KeyNotScopeAndId => "its primary key is not the extension's",
            ThroughSpi::ColumnMissing => "a column the call reads is missing",
        })
    }
}

/// The row found: the values of the caller's columns, valid while the scan holds it.
pub struct Row {
    /// (value, is null, type) per column, in the order of the caller's `columns`.
    values: Vec<(Datum, bool, Oid)>,
}

impl Columns for Row {
    fn at<T: FromDatum + IntoDatum>(&self, n: usize) -> SpiResult<Option<T>> {
        let (value, is_null, type_oid) = self.values[n - 1];
        assert!(T::is_compatible_with(type_oid), "column {n} read as an incompatible type");
        // SAFETY: the datum is the column's, typed `type_oid`, held by the scan's slot; the
        // FromDatum of every type the callers read copies it out.
        Ok(unsafe { T::from_polymorphic_datum(value, is_null, type_oid) })
    }
}

/// Reads the row of (scope, id) in `table` directly and passes it (None: there is none) to
/// `answer`, whose result it returns; None when the read must go through SPI instead.
/// `columns` are the names `answer` reads (as `spi::get` does, by position in this list).
pub fn read<R>(
    table: Table,
    scope: &str,
    id: &str,
    columns: &'static [&'static str],
    answer: impl FnOnce(Option<&Row>) -> R,
) -> Option<R> {
    // SAFETY: catalog look-ups, relation opens and an index scan, closed before returning;
    // on an error the transaction's abort releases what is still open.
    let opened = unsafe { open(table, columns) };
    match opened {
        Err(why) => {
            report(|| format!("idempotency.{} read through SPI: {why}", table.name().to_string_lossy()));
            None
        }
        Ok(opened) => {
            report(|| format!("idempotency.{} read directly", table.name().to_string_lossy()));
            // SAFETY: as above; `opened` was checked by `open`.
            Some(unsafe { opened.fetch(scope, id, answer) })
        }
    }
}

/// A DEBUG1 message, formatted only when someone will see it.
fn report(message: impl FnOnce() -> String) {
    // SAFETY: a plain read of the logging levels.
    if unsafe { pg_sys::message_level_is_interesting(pg_sys::DEBUG1 as i32) } {
        pgrx::debug1!("{}", message());
    }
}

/// The table and its primary-key index, open and checked, and what the scan needs.
struct Opened {
    table: pg_sys::Relation,
    index: pg_sys::Relation,
    snapshot: pg_sys::Snapshot,
    /// The attribute number of each of the caller's columns.
    attnums: Vec<usize>,
}

unsafe fn open(table: Table, columns: &[&str]) -> Result<Opened, ThroughSpi> {
    if !settings::direct_read() {
        return Err(ThroughSpi::Setting);
    }
    if citus_loaded() {
        return Err(ThroughSpi::Citus);
    }
    if std::ptr::addr_of!(pg_sys::ExecutorCheckPerms_hook).read().is_some() {
        return Err(ThroughSpi::PermissionsHook);
    }
    if !pg_sys::ActiveSnapshotSet() {
        return Err(ThroughSpi::NoSnapshot);
    }
    let namespace = pg_sys::get_namespace_oid(c"idempotency".as_ptr(), true);
    let relid = match namespace {
        pg_sys::InvalidOid => pg_sys::InvalidOid,
        namespace => pg_sys::get_relname_relid(table.name().as_ptr(), namespace),
    };
    if relid == pg_sys::InvalidOid {
        return Err(ThroughSpi::NoTable);
    }
    if pg_sys::pg_class_aclcheck(relid, pg_sys::GetUserId(), pg_sys::ACL_SELECT as pg_sys::AclMode)
        != pg_sys::AclResult::ACLCHECK_OK
    {
        return Err(ThroughSpi::NoSelectPrivilege);
    }
    let rel = pg_sys::table_open(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
    let index = match checked_index(rel, table) {
        Ok(index) => index,
        Err(why) => {
            pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
            return Err(why);
        }
    };
    let desc = (*rel).rd_att;
    let attnums: Option<Vec<usize>> = columns.iter().map(|name| attnum(desc, name)).collect();
    let Some(attnums) = attnums else {
        pg_sys::index_close(index, pg_sys::NoLock as pg_sys::LOCKMODE);
        pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        return Err(ThroughSpi::ColumnMissing);
    };
    Ok(Opened { table: rel, index, snapshot: pg_sys::GetActiveSnapshot(), attnums })
}

/// The table's primary-key index, opened, if the table is one the direct read may read.
unsafe fn checked_index(rel: pg_sys::Relation, table: Table) -> Result<pg_sys::Relation, ThroughSpi> {
    let class = &*(*rel).rd_rel;
    if class.relkind as u8 != pg_sys::RELKIND_RELATION || class.relam != pg_sys::HEAP_TABLE_AM_OID {
        return Err(ThroughSpi::NotPlainHeapTable);
    }
    if class.relrowsecurity {
        return Err(ThroughSpi::RowLevelSecurity);
    }
    if class.relhasrules || !(*rel).rd_rules.is_null() {
        return Err(ThroughSpi::Rules);
    }
    if !(*rel).rd_indexvalid {
        pg_sys::list_free(pg_sys::RelationGetIndexList(rel));
    }
    let pk = (*rel).rd_pkindex;
    if pk == pg_sys::InvalidOid {
        return Err(ThroughSpi::KeyNotScopeAndId);
    }
    let index = pg_sys::index_open(pk, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
    if key_is_scope_and_id(rel, index, table) {
        Ok(index)
    } else {
        pg_sys::index_close(index, pg_sys::NoLock as pg_sys::LOCKMODE);
        Err(ThroughSpi::KeyNotScopeAndId)
    }
}

/// The index is a valid btree on exactly (scope, id), both text, with text's default
/// operators and each column's own collation: the probe the planner would make of it.
unsafe fn key_is_scope_and_id(rel: pg_sys::Relation, index: pg_sys::Relation, table: Table) -> bool {
    let form = &*(*index).rd_index;
    if (*(*index).rd_rel).relam != pg_sys::BTREE_AM_OID || !form.indisvalid || form.indnkeyatts != 2 {
        return false;
    }
    let desc = (*rel).rd_att;
    let keys = form.indkey.values.as_slice(2);
    ["scope", table.id_column()].iter().enumerate().all(|(i, name)| {
        let Some(n) = attnum(desc, name) else { return false };
        let column = &attributes(desc)[n - 1];
        keys[i] as usize == n
            && column.atttypid == pg_sys::TEXTOID
            && *(*index).rd_opfamily.add(i) == pg_sys::TEXT_BTREE_FAM_OID
            && *(*index).rd_indcollation.add(i) == column.attcollation
    })
}

/// The columns of `desc`, in order.
unsafe fn attributes<'a>(desc: pg_sys::TupleDesc) -> &'a [pg_sys::FormData_pg_attribute] {
    #[cfg(not(feature = "pg18"))]
    let first = (*desc).attrs.as_ptr();
    // Since 18 they follow the compact attributes.
    #[cfg(feature = "pg18")]
    let first =
        (*desc).compact_attrs.as_ptr().add((*desc).natts as usize).cast::<pg_sys::FormData_pg_attribute>();
    std::slice::from_raw_parts(first, (*desc).natts as usize)
}

/// The 1-based number of the live column `name` of `desc`.
unsafe fn attnum(desc: pg_sys::TupleDesc, name: &str) -> Option<usize> {
    attributes(desc)
        .iter()
        .position(|a| {
            !a.attisdropped && CStr::from_ptr(a.attname.data.as_ptr()).to_bytes() == name.as_bytes()
        })
        .map(|i| i + 1)
}

impl Opened {
    unsafe fn fetch<R>(self, scope: &str, id: &str, answer: impl FnOnce(Option<&Row>) -> R) -> R {
        let mut keys: [pg_sys::ScanKeyData; 2] = std::mem::zeroed();
        for (i, value) in [scope, id].into_iter().enumerate() {
            pg_sys::ScanKeyEntryInitialize(
                &mut keys[i],
                0,
                (i + 1) as pg_sys::AttrNumber,
                pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber,
                pg_sys::InvalidOid,
                *(*self.index).rd_indcollation.add(i),
                pg_sys::Oid::from(pg_sys::F_TEXTEQ),
                value.into_datum().expect("text is never NULL"),
            );
        }
        let slot = pg_sys::table_slot_create(self.table, std::ptr::null_mut());
        #[cfg(not(feature = "pg18"))]
        let scan = pg_sys::index_beginscan(self.table, self.index, self.snapshot, 2, 0);
        #[cfg(feature = "pg18")]
        let scan = pg_sys::index_beginscan(self.table, self.index, self.snapshot, std::ptr::null_mut(), 2, 0);
        pg_sys::index_rescan(scan, keys.as_mut_ptr(), 2, std::ptr::null_mut(), 0);
        let result = if pg_sys::index_getnext_slot(scan, pg_sys::ScanDirection::ForwardScanDirection, slot) {
            let last = self.attnums.iter().copied().max().unwrap_or(0) as i16;
            if (*slot).tts_nvalid < last {
                pg_sys::slot_getsomeattrs_int(slot, last.into());
            }
            let columns = attributes((*slot).tts_tupleDescriptor);
            let values = self
                .attnums
                .iter()
                .map(|&n| {
                    let type_oid = columns[n - 1].atttypid;
                    (*(*slot).tts_values.add(n - 1), *(*slot).tts_isnull.add(n - 1), type_oid)
                })
                .collect();
            answer(Some(&Row { values }))
        } else {
            answer(None)
        };
        pg_sys::index_endscan(scan);
        pg_sys::ExecDropSingleTupleTableSlot(slot);
        pg_sys::index_close(self.index, pg_sys::NoLock as pg_sys::LOCKMODE);
        pg_sys::table_close(self.table, pg_sys::NoLock as pg_sys::LOCKMODE);
        result
    }
}

thread_local! {
    // shared_preload_libraries cannot change while the server runs.
    static CITUS_LOADED: OnceCell<bool> = const { OnceCell::new() };
}

/// Citus is in shared_preload_libraries.
pub fn citus_loaded() -> bool {
    CITUS_LOADED.with(|loaded| {
        *loaded.get_or_init(|| {
            // SAFETY: reads a setting's current value, copied before anything else runs.
            let list = unsafe { pg_sys::GetConfigOption(c"shared_preload_libraries".as_ptr(), true, false) };
            !list.is_null() && names_citus(&unsafe { CStr::from_ptr(list) }.to_string_lossy())
        })
    })
}

/// Does a shared_preload_libraries value name Citus ("citus", "$libdir/citus", "citus.so")?
fn names_citus(list: &str) -> bool {
    list.split(',').any(|entry| {
        let entry = entry.trim().trim_matches('"');
        let file = entry.rsplit('/').next().unwrap_or(entry);
        file.strip_suffix(".so").unwrap_or(file) == "citus"
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn citus_is_found_in_any_spelling_of_the_list() {
        for list in ["citus", "pg_cron, citus", " \"citus\" ,pg_stat_statements", "$libdir/citus", "citus.so"]
        {
            assert!(names_citus(list), "{list}");
        }
        for list in ["", "pg_cron", "citus_columnar", "pg_citus", "citusdata"] {
            assert!(!names_citus(list), "{list}");
        }
    }

    #[test]
    fn every_reason_says_something_of_its_own() {
        let all = [
            ThroughSpi::Setting,
            ThroughSpi::Citus,
            ThroughSpi::PermissionsHook,
            ThroughSpi::NoSnapshot,
            ThroughSpi::NoTable,
            ThroughSpi::NoSelectPrivilege,
            ThroughSpi::NotPlainHeapTable,
            ThroughSpi::RowLevelSecurity,
            ThroughSpi::Rules,
            ThroughSpi::KeyNotScopeAndId,
            ThroughSpi::ColumnMissing,
        ];
        let texts: std::collections::HashSet<String> = all.iter().map(|w| w.to_string()).collect();
        assert_eq!(texts.len(), all.len());
    }
}
