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
//!
//! A partitioned table (0.6.0) is read partition by partition, newest period first, then the
//! others (src/layout.rs), with the privileges and row-level security of the table itself, as
//! a query of the table would; a partition whose every record is dead (src/layout.rs says
//! when) is not read. A key has at most one record in the partitions that are read (every
//! write that creates one holds the key's lock and removes an expired one first), so the first
//! found is the record. The table a 0.5.0 database kept its records in is read last while it
//! exists.

use std::cell::OnceCell;
use std::ffi::CStr;
use std::fmt;

use pgrx::pg_sys::{self, Datum, Oid};
use pgrx::spi::SpiResult;
use pgrx::{FromDatum, IntoDatum};

use pgrx::datum::TimestampWithTimeZone;

use crate::layout;
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

    /// How long after a partition's period ends its records still answer: the tombstones
    /// of keys (idempotency.tombstone_ttl), in microseconds.
    fn grace(self) -> i64 {
        match self {
            Table::Keys => settings::tombstone_ttl().map_or(0, |ttl| {
                (i64::from(ttl.months()) * 30 + i64::from(ttl.days())) * 86_400_000_000 + ttl.micros()
            }),
            Table::Messages => 0,
        }
    }

    /// The table a database updated from 0.5.0 kept its records in, while they move into
    /// the partitions (sql/idempotency--0.5.0--0.6.0.sql); read after the partitions.
    fn legacy_name(self) -> &'static CStr {
        match self {
            Table::Keys => c"keys_legacy",
            Table::Messages => c"messages_legacy",
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
pub enum ThroughSpi {
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
    ColumnsDiffer,
    PartitionsUnknown,
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
            ThroughSpi::ColumnsDiffer => "its partitions do not all have the columns in the same places",
            ThroughSpi::PartitionsUnknown => "it is partitioned otherwise than the extension partitions it",
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
/// `now` is the time the records are read as of: partitions dead by then are not read.
pub fn read<R>(
    table: Table,
    scope: &str,
    id: &str,
    columns: &'static [&'static str],
    now: TimestampWithTimeZone,
    answer: impl FnOnce(Option<&Row>) -> R,
) -> Option<R> {
    // SAFETY: catalog look-ups, relation opens and index scans, closed before returning;
    // on an error the transaction's abort releases what is still open.
    let opened = unsafe { open(table, columns, now) };
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

/// The tables to read, each with its primary-key index, open and checked, in the order they
/// are read; and what the scans need.
struct Opened {
    tables: Vec<(pg_sys::Relation, pg_sys::Relation)>,
    snapshot: pg_sys::Snapshot,
    /// The attribute number of each of the caller's columns (the same in every partition,
    /// checked).
    attnums: Vec<usize>,
}

impl Opened {
    unsafe fn close(self) {
        for (rel, index) in self.tables {
            pg_sys::index_close(index, pg_sys::NoLock as pg_sys::LOCKMODE);
            pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        }
    }
}

/// The relation `name` in schema idempotency (InvalidOid: none).
unsafe fn relid_of(name: &CStr) -> Oid {
    match pg_sys::get_namespace_oid(c"idempotency".as_ptr(), true) {
        pg_sys::InvalidOid => pg_sys::InvalidOid,
        namespace => pg_sys::get_relname_relid(name.as_ptr(), namespace),
    }
}

/// Does the table a 0.5.0 database kept `table`'s records in still exist?
pub fn legacy_exists(table: Table) -> bool {
    // SAFETY: catalog look-ups by name.
    unsafe { relid_of(table.legacy_name()) != pg_sys::InvalidOid }
}

/// May the current user read all of relation `relid` (table-wide SELECT)?
unsafe fn may_select(relid: Oid) -> bool {
    pg_sys::pg_class_aclcheck(relid, pg_sys::GetUserId(), pg_sys::ACL_SELECT as pg_sys::AclMode)
        == pg_sys::AclResult::ACLCHECK_OK
}

/// A query of `rel` would be one the direct read can stand for: no row-level security, no
/// rules. (Of a partitioned table these are the table's own, as a query of it applies.)
unsafe fn queried_plainly(rel: pg_sys::Relation) -> Result<(), ThroughSpi> {
    if (*(*rel).rd_rel).relrowsecurity {
        return Err(ThroughSpi::RowLevelSecurity);
    }
    if (*(*rel).rd_rel).relhasrules || !(*rel).rd_rules.is_null() {
        return Err(ThroughSpi::Rules);
    }
    Ok(())
}

unsafe fn open(table: Table, columns: &[&str], now: TimestampWithTimeZone) -> Result<Opened, ThroughSpi> {
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
    let relid = relid_of(table.name());
    if relid == pg_sys::InvalidOid {
        return Err(ThroughSpi::NoTable);
    }
    if !may_select(relid) {
        return Err(ThroughSpi::NoSelectPrivilege);
    }
    let rel = pg_sys::table_open(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
    let leaves = queried_plainly(rel)
        .and_then(|()| layout::leaves_to_read(rel, now, table.grace()).ok_or(ThroughSpi::PartitionsUnknown));
    let leaves = match leaves {
        Ok(leaves) => leaves,
        Err(why) => {
            pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
            return Err(why);
        }
    };
    let mut opened =
        Opened { tables: Vec::new(), snapshot: pg_sys::GetActiveSnapshot(), attnums: Vec::new() };
    let legacy = relid_of(table.legacy_name());
    let mut result = Ok(());
    for (leaf, through_parent) in
        leaves.into_iter().map(|l| (l, true)).chain((legacy != pg_sys::InvalidOid).then_some((legacy, false)))
    {
        // The table a 0.5.0 database kept its records in is queried by name: its own rights.
        if !through_parent && !may_select(leaf) {
            result = Err(ThroughSpi::NoSelectPrivilege);
            break;
        }
        let leaf_rel = if leaf == relid {
            rel
        } else {
            pg_sys::table_open(leaf, pg_sys::AccessShareLock as pg_sys::LOCKMODE)
        };
        let checked = (if through_parent { Ok(()) } else { queried_plainly(leaf_rel) })
            .and_then(|()| checked_index(leaf_rel, table))
            .and_then(|index| match attnums_of(leaf_rel, columns) {
                Some(attnums) if opened.attnums.is_empty() || opened.attnums == attnums => {
                    Ok((index, attnums))
                }
                found => {
                    pg_sys::index_close(index, pg_sys::NoLock as pg_sys::LOCKMODE);
                    Err(if found.is_none() { ThroughSpi::ColumnMissing } else { ThroughSpi::ColumnsDiffer })
                }
            });
        match checked {
            Ok((index, attnums)) => {
                opened.attnums = attnums;
                opened.tables.push((leaf_rel, index));
            }
            Err(why) => {
                if leaf_rel != rel {
                    pg_sys::table_close(leaf_rel, pg_sys::NoLock as pg_sys::LOCKMODE);
                }
                result = Err(why);
                break;
            }
        }
    }
    // The partitioned table itself stays locked (as a query of it would leave it) but is not read.
    if !opened.tables.iter().any(|(r, _)| *r == rel) {
        pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
    }
    match result {
        Ok(()) => Ok(opened),
        Err(why) => {
            opened.close();
            Err(why)
        }
    }
}

/// The attribute numbers of `columns` in `rel` (None: one is missing).
unsafe fn attnums_of(rel: pg_sys::Relation, columns: &[&str]) -> Option<Vec<usize>> {
    let desc = (*rel).rd_att;
    columns.iter().map(|name| attnum(desc, name)).collect()
}

/// The table's primary-key index, opened, if the table is one the direct read may read.
unsafe fn checked_index(rel: pg_sys::Relation, table: Table) -> Result<pg_sys::Relation, ThroughSpi> {
    let class = &*(*rel).rd_rel;
    if class.relkind as u8 != pg_sys::RELKIND_RELATION || class.relam != pg_sys::HEAP_TABLE_AM_OID {
        return Err(ThroughSpi::NotPlainHeapTable);
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
    /// Probes each table's primary key in turn; the first row found is the key's record.
    unsafe fn fetch<R>(self, scope: &str, id: &str, answer: impl FnOnce(Option<&Row>) -> R) -> R {
        let mut answer = Some(answer);
        let mut result = None;
        let slot_of = |rel| pg_sys::table_slot_create(rel, std::ptr::null_mut());
        for &(rel, index) in &self.tables {
            let mut keys: [pg_sys::ScanKeyData; 2] = std::mem::zeroed();
            for (i, value) in [scope, id].into_iter().enumerate() {
                pg_sys::ScanKeyEntryInitialize(
                    &mut keys[i],
                    0,
                    (i + 1) as pg_sys::AttrNumber,
                    pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber,
                    pg_sys::InvalidOid,
                    *(*index).rd_indcollation.add(i),
                    pg_sys::Oid::from(pg_sys::F_TEXTEQ),
                    value.into_datum().expect("text is never NULL"),
                );
            }
            let slot = slot_of(rel);
            #[cfg(not(feature = "pg18"))]
            let scan = pg_sys::index_beginscan(rel, index, self.snapshot, 2, 0);
            #[cfg(feature = "pg18")]
            let scan = pg_sys::index_beginscan(rel, index, self.snapshot, std::ptr::null_mut(), 2, 0);
            pg_sys::index_rescan(scan, keys.as_mut_ptr(), 2, std::ptr::null_mut(), 0);
            if pg_sys::index_getnext_slot(scan, pg_sys::ScanDirection::ForwardScanDirection, slot) {
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
                result = Some((answer.take().expect("answered once"))(Some(&Row { values })));
            }
            pg_sys::index_endscan(scan);
            pg_sys::ExecDropSingleTupleTableSlot(slot);
            if result.is_some() {
                break;
            }
        }
        let result = match result {
            Some(result) => result,
            None => (answer.take().expect("answered once"))(None),
        };
        self.close();
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
            ThroughSpi::ColumnsDiffer,
            ThroughSpi::PartitionsUnknown,
        ];
        let texts: std::collections::HashSet<String> = all.iter().map(|w| w.to_string()).collect();
        assert_eq!(texts.len(), all.len());
    }
}
