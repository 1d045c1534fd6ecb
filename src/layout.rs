//! Where the records of a partitioned table live, and in which order a read looks for one
//! (sql/bootstrap.sql, sql/partitions.sql): the periods newest first (a record written
//! seconds ago sits in one of the newest), then the partition of claims in flight (bounded
//! below by MINVALUE), then the far one (the default partition). A period whose upper bound
//! lies `grace` or longer before now holds only dead records: it is not read (idem_sweep
//! drops it).

use pgrx::datum::TimestampWithTimeZone;
use pgrx::pg_sys::{self, Oid};

/// The partition key of idempotency.keys as sql/bootstrap.sql defines it (every operator
/// qualified, so that nothing on a search_path can change it; the planner compares the parse
/// trees, so it still matches the table's).
macro_rules! keys_partition_key {
    () => {
        "(CASE WHEN status OPERATOR(pg_catalog.=) 'completed' THEN expires_at \
         ELSE '-infinity'::pg_catalog.timestamptz END)"
    };
}

/// A condition that keeps a statement on idempotency.keys in the partition of claims in
/// flight: the planner reads keys_claims only.
macro_rules! in_claims {
    () => {
        concat!(keys_partition_key!(), " OPERATOR(pg_catalog.=) '-infinity'::pg_catalog.timestamptz")
    };
}

/// One partition as its bounds show it (times in PostgreSQL's microseconds; None: MINVALUE
/// below, MAXVALUE above).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub lower: Option<i64>,
    pub upper: Option<i64>,
}

/// The order to read `parts` (index into them, with bounds; `default` the default
/// partition's index) as of `now`, leaving out periods dead for longer than `grace`.
pub fn read_order(parts: &[Bounds], default: Option<usize>, now: i64, grace: i64) -> Vec<usize> {
    let mut periods: Vec<usize> = (0..parts.len())
        .filter(|&i| Some(i) != default && parts[i].lower.is_some())
        .filter(|&i| parts[i].upper.is_none_or(|upper| upper.saturating_add(grace) > now))
        .collect();
    periods.sort_by_key(|&i| std::cmp::Reverse(parts[i].upper.unwrap_or(i64::MAX)));
    let claims = (0..parts.len()).filter(|&i| Some(i) != default && parts[i].lower.is_none());
    periods.into_iter().chain(claims).chain(default).collect()
}

/// The relations to read for a record of the open table `rel`, in order: itself when it is
/// a plain table; its partitions (src/layout.rs's order) when it is partitioned by a range
/// of timestamps, as the extension makes it; None otherwise.
///
/// # Safety
/// `rel` is open and locked.
pub unsafe fn leaves_to_read(
    rel: pg_sys::Relation,
    now: TimestampWithTimeZone,
    grace: i64,
) -> Option<Vec<Oid>> {
    let class = &*(*rel).rd_rel;
    if class.relkind as u8 == pg_sys::RELKIND_RELATION {
        return Some(vec![(*rel).rd_id]);
    }
    if class.relkind as u8 != pg_sys::RELKIND_PARTITIONED_TABLE {
        return None;
    }
    let desc = pg_sys::RelationGetPartitionDesc(rel, true);
    if desc.is_null() {
        return None;
    }
    let nparts = (*desc).nparts.max(0) as usize;
    let oids = std::slice::from_raw_parts((*desc).oids, nparts);
    let leaf = std::slice::from_raw_parts((*desc).is_leaf, nparts);
    if leaf.iter().any(|l| !l) {
        return None;
    }
    let info = (*desc).boundinfo;
    if nparts == 0 {
        return Some(Vec::new());
    }
    // 'r' (PARTITION_STRATEGY_RANGE, a constant of its own up to 15, of an enum since 16).
    if info.is_null() || (*info).strategy as u8 != b'r' {
        return None;
    }
    let mut parts = vec![Bounds { lower: None, upper: None }; nparts];
    let ndatums = (*info).ndatums.max(0) as usize;
    let bound = |i: usize| -> Option<i64> {
        let kind = **(*info).kind.add(i);
        (kind == pg_sys::PartitionRangeDatumKind::PARTITION_RANGE_DATUM_VALUE)
            .then(|| (**(*info).datums.add(i)).value() as i64)
    };
    // indexes[i] is the partition whose upper bound is datums[i]; its lower bound is
    // datums[i - 1] (partbounds.c, create_range_bounds).
    for i in 0..ndatums {
        let p = *(*info).indexes.add(i);
        if p >= 0 && (p as usize) < nparts && i > 0 {
            parts[p as usize] = Bounds { lower: bound(i - 1), upper: bound(i) };
        }
    }
    let default = usize::try_from((*info).default_index).ok().filter(|&d| d < nparts);
    let now = pg_sys::TimestampTz::from(now);
    Some(read_order(&parts, default, now, grace).into_iter().map(|i| oids[i]).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: i64 = 3_600_000_000;

    fn period(lower: i64, upper: i64) -> Bounds {
        Bounds { lower: Some(lower * HOUR), upper: Some(upper * HOUR) }
    }

    #[test]
    fn periods_newest_first_then_claims_then_far() {
        let claims = Bounds { lower: None, upper: Some(0) };
        let far = Bounds { lower: None, upper: None };
        let parts = [period(24, 48), claims, period(48, 72), far, period(0, 24)];
        assert_eq!(read_order(&parts, Some(3), 30 * HOUR, 0), [2, 0, 1, 3]);
    }

    #[test]
    fn dead_periods_are_left_out_until_their_grace_ends() {
        let parts = [period(0, 24), period(24, 48)];
        // At hour 30 the period ending at 24 is dead ...
        assert_eq!(read_order(&parts, None, 30 * HOUR, 0), [1]);
        // ... unless its tombstones last 7 more hours.
        assert_eq!(read_order(&parts, None, 30 * HOUR, 7 * HOUR), [1, 0]);
        // A period ends at its upper bound exactly.
        assert_eq!(read_order(&parts, None, 24 * HOUR, 0), [1]);
    }

    #[test]
    fn a_plain_layout_of_claims_and_far_only() {
        let parts = [Bounds { lower: None, upper: Some(0) }, Bounds { lower: None, upper: None }];
        assert_eq!(read_order(&parts, Some(1), 0, 0), [0, 1]);
        assert!(read_order(&[], None, 0, 0).is_empty());
    }
}
