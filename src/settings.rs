//! The `idempotency.*` settings, registered in one place.
//!
//! The three intervals (default_ttl, default_lease, tombstone_ttl) are string settings whose
//! check hook parses the text with PostgreSQL's own interval input (any spelling `interval`
//! accepts: '24h', '1 day', 'PT5M') and refuses anything outside the setting's rule (positive;
//! tombstone_ttl may also be 0, off). The parsed value travels to the assign hook through the GUC "extra" pointer, so reading a setting costs nothing per call.

use std::ffi::{c_char, c_void, CStr};
use std::ptr::{addr_of, addr_of_mut};

use pgrx::datum::Interval;
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::prelude::*;
use pgrx::{direct_function_call, pg_sys, IntoDatum};

use crate::validate;

static mut DEFAULT_TTL_TEXT: *mut c_char = std::ptr::null_mut();
static mut DEFAULT_TTL: pg_sys::Interval = pg_sys::Interval { time: 24 * 3_600_000_000, day: 0, month: 0 };
static mut DEFAULT_LEASE_TEXT: *mut c_char = std::ptr::null_mut();
static mut DEFAULT_LEASE: pg_sys::Interval = pg_sys::Interval { time: 5 * 60_000_000, day: 0, month: 0 };

static mut TOMBSTONE_TTL_TEXT: *mut c_char = std::ptr::null_mut();
static mut TOMBSTONE_TTL: pg_sys::Interval = pg_sys::Interval { time: 0, day: 0, month: 0 };

static MAX_RESPONSE_SIZE_KB: GucSetting<i32> = GucSetting::<i32>::new(1024);
static DIRECT_READ: GucSetting<bool> = GucSetting::<bool>::new(true);
static KEY_LOCK_BITS: GucSetting<i32> = GucSetting::<i32>::new(64);

// The sending side's settings are read by sql/send.sql (current_setting), shared with the
// portable edition; registering them here checks a value when it is SET.
// idempotency.partition_period is read by sql/partitions.sql (current_setting), shared with
// the portable edition; registering it here checks a value when it is SET.
static mut PARTITION_PERIOD_TEXT: *mut c_char = std::ptr::null_mut();

static mut SEND_BACKOFF_BASE_TEXT: *mut c_char = std::ptr::null_mut();
static mut SEND_BACKOFF_CAP_TEXT: *mut c_char = std::ptr::null_mut();
static mut SEND_GIVE_UP_AFTER_TEXT: *mut c_char = std::ptr::null_mut();
static mut SEND_RETRY_WINDOW_TEXT: *mut c_char = std::ptr::null_mut();
// The values the native idem_send_next and idem_send_result use (the portable edition reads
// the text above with current_setting).
static mut SEND_BACKOFF_BASE: pg_sys::Interval = pg_sys::Interval { time: 1_000_000, day: 0, month: 0 };
static mut SEND_BACKOFF_CAP: pg_sys::Interval = pg_sys::Interval { time: 10 * 60_000_000, day: 0, month: 0 };
static mut SEND_RETRY_WINDOW: pg_sys::Interval = pg_sys::Interval { time: 60_000_000, day: 0, month: 0 };
static SEND_RETRY_BUDGET: GucSetting<f64> = GucSetting::<f64>::new(0.1);

/// Called once per backend, from `_PG_init`.
pub fn register() {
    GucRegistry::define_int_guc(
        c"idempotency.max_response_size",
        c"Largest response (body plus headers) or checkpoint data that may be stored.",
        c"idem_complete and idem_checkpoint refuse anything larger with SQLSTATE 54000.",
        &MAX_RESPONSE_SIZE_KB,
        1,
        1024 * 1024,
        GucContext::Userset,
        GucFlags::UNIT_KB,
    );
    GucRegistry::define_bool_guc(
        c"idempotency.direct_read",
        c"Whether idem_claim and idem_seen read their record directly through the primary-key index where that is sure to answer as SPI would.",
        c"off reads every record through SPI (docs/operations.md#read-paths).",
        &DIRECT_READ,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"idempotency.key_lock_bits",
        c"How many bits of the hash of (scope, key) name its key lock: for tests that force collisions.",
        c"64 (the default) in production; fewer make unrelated keys share locks (they only wait for each other).",
        &KEY_LOCK_BITS,
        1,
        64,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_float_guc(
        c"idempotency.send_retry_budget",
        c"Per target, while the receiver fails, the retries idem_send_next hands out over send_retry_window, as a share of its first attempts (plus 10).",
        c"0 turns retries off. Final answers since the latest retryable one earn two retries each (docs/sending.md).",
        &SEND_RETRY_BUDGET,
        0.0,
        1_000_000.0,
        GucContext::Userset,
        GucFlags::default(),
    );
    // SAFETY: called from _PG_init on the backend's main thread; the statics are the GUC's
    // storage for as long as the library is loaded.
    unsafe {
        pg_sys::DefineCustomStringVariable(
            c"idempotency.default_ttl".as_ptr(),
            c"How long an idempotency record lives when idem_claim or idem_seen gets no ttl.".as_ptr(),
            c"A positive interval; a record with expires_at <= now() is treated as absent.".as_ptr(),
            addr_of_mut!(DEFAULT_TTL_TEXT),
            c"24h".as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            0,
            Some(check_positive_interval),
            Some(assign_default_ttl),
            None,
        );
        pg_sys::DefineCustomStringVariable(
            c"idempotency.default_lease".as_ptr(),
            c"How long an in_progress claim protects its owner when no lease is given.".as_ptr(),
            c"A positive interval; after it a retry may take the claim over.".as_ptr(),
            addr_of_mut!(DEFAULT_LEASE_TEXT),
            c"5min".as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            0,
            Some(check_positive_interval),
            Some(assign_default_lease),
            None,
        );
        pg_sys::DefineCustomStringVariable(
            c"idempotency.tombstone_ttl".as_ptr(),
            c"How long a completed record that expired still answers `expired` (410) instead of running again.".as_ptr(),
            c"0 (the default) turns tombstones off; otherwise a positive interval after expires_at.".as_ptr(),
            addr_of_mut!(TOMBSTONE_TTL_TEXT),
            c"0".as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            0,
            Some(check_non_negative_interval),
            Some(assign_tombstone_ttl),
            None,
        );
        pg_sys::DefineCustomStringVariable(
            c"idempotency.partition_period".as_ptr(),
            c"How much time of expiries each partition of idempotency.keys and idempotency.messages covers.".as_ptr(),
            c"0 (none: records past the claims are swept by DELETE) or a fixed length of 1 second to 366 days; idem_sweep makes partitions ahead and drops them once over.".as_ptr(),
            addr_of_mut!(PARTITION_PERIOD_TEXT),
            c"1d".as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            0,
            Some(check_partition_period),
            None,
            None,
        );
        pg_sys::DefineCustomStringVariable(
            c"idempotency.send_backoff_base".as_ptr(),
            c"The first retry's backoff bound of idem_send_result (full jitter below base * 2^(attempts - 1)).".as_ptr(),
            c"A positive interval.".as_ptr(),
            addr_of_mut!(SEND_BACKOFF_BASE_TEXT),
            c"1s".as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            0,
            Some(check_positive_interval),
            Some(assign_send_backoff_base),
            None,
        );
        pg_sys::DefineCustomStringVariable(
            c"idempotency.send_backoff_cap".as_ptr(),
            c"The largest backoff bound of idem_send_result.".as_ptr(),
            c"A positive interval.".as_ptr(),
            addr_of_mut!(SEND_BACKOFF_CAP_TEXT),
            c"10min".as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            0,
            Some(check_positive_interval),
            Some(assign_send_backoff_cap),
            None,
        );
        pg_sys::DefineCustomStringVariable(
            c"idempotency.send_give_up_after".as_ptr(),
            c"How long idem_send keeps trying when it gets no give_up_after.".as_ptr(),
            c"A positive interval; keep it below the receiver's retention of keys.".as_ptr(),
            addr_of_mut!(SEND_GIVE_UP_AFTER_TEXT),
            c"23h".as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            0,
            Some(check_positive_interval),
            None,
            None,
        );
        pg_sys::DefineCustomStringVariable(
            c"idempotency.send_retry_window".as_ptr(),
            c"The window over which the retry budget of idem_send_next counts attempts and answers.".as_ptr(),
            c"An interval of 1 second to 1 day; give every sender of a target the same.".as_ptr(),
            addr_of_mut!(SEND_RETRY_WINDOW_TEXT),
            c"1min".as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            0,
            Some(check_retry_window),
            Some(assign_send_retry_window),
            None,
        );
        pg_sys::MarkGUCPrefixReserved(c"idempotency".as_ptr());
    }
}

/// idempotency.direct_read.
pub fn direct_read() -> bool {
    DIRECT_READ.get()
}

/// idempotency.key_lock_bits.
pub fn key_lock_bits() -> u32 {
    KEY_LOCK_BITS.get() as u32
}

/// idempotency.max_response_size in bytes.
pub fn max_response_bytes() -> usize {
    MAX_RESPONSE_SIZE_KB.get() as usize * 1024
}

pub fn default_ttl() -> Interval {
    // SAFETY: written only by the assign hook, on this same thread.
    unsafe { to_interval(*addr_of!(DEFAULT_TTL)) }
}

pub fn default_lease() -> Interval {
    // SAFETY: as above.
    unsafe { to_interval(*addr_of!(DEFAULT_LEASE)) }
}

/// idempotency.tombstone_ttl, or None when it is zero (tombstones off).
pub fn tombstone_ttl() -> Option<Interval> {
    // SAFETY: as above.
    let raw = unsafe { *addr_of!(TOMBSTONE_TTL) };
    if raw.month == 0 && raw.day == 0 && raw.time == 0 {
        None
    } else {
        Some(to_interval(raw))
    }
}

/// idempotency.send_backoff_base.
pub fn send_backoff_base() -> Interval {
    // SAFETY: as above.
    unsafe { to_interval(*addr_of!(SEND_BACKOFF_BASE)) }
}

/// idempotency.send_backoff_cap.
pub fn send_backoff_cap() -> Interval {
    // SAFETY: as above.
    unsafe { to_interval(*addr_of!(SEND_BACKOFF_CAP)) }
}

/// idempotency.send_retry_window.
pub fn send_retry_window() -> Interval {
    // SAFETY: as above.
    unsafe { to_interval(*addr_of!(SEND_RETRY_WINDOW)) }
}

fn to_interval(raw: pg_sys::Interval) -> Interval {
    Interval::new(raw.month, raw.day, raw.time).unwrap_or_else(|_| Interval::from_micros(raw.time))
}

fn parse_interval(text: &CStr) -> Option<Interval> {
    PgTryBuilder::new(|| unsafe {
        direct_function_call::<Interval>(
            pg_sys::interval_in,
            &[
                Some(pg_sys::Datum::from(text.as_ptr())),
                pg_sys::InvalidOid.into_datum(),
                (-1i32).into_datum(),
            ],
        )
    })
    .catch_others(|_| None)
    .execute()
}

#[pg_guard]
unsafe extern "C-unwind" fn check_positive_interval(
    newval: *mut *mut c_char,
    extra: *mut *mut c_void,
    _source: pg_sys::GucSource::Type,
) -> bool {
    check_interval(
        newval,
        extra,
        validate::positive_interval,
        c"The value must be a positive interval of at most 10000 years.",
    )
}

#[pg_guard]
unsafe extern "C-unwind" fn check_partition_period(
    newval: *mut *mut c_char,
    extra: *mut *mut c_void,
    _source: pg_sys::GucSource::Type,
) -> bool {
    check_interval(
        newval,
        extra,
        validate::partition_period,
        c"The value must be 0 or a fixed length of 1 second to 366 days (no months).",
    )
}

#[pg_guard]
unsafe extern "C-unwind" fn check_non_negative_interval(
    newval: *mut *mut c_char,
    extra: *mut *mut c_void,
    _source: pg_sys::GucSource::Type,
) -> bool {
    check_interval(
        newval,
        extra,
        validate::non_negative_interval,
        c"The value must be 0 (off) or a positive interval of at most 10000 years.",
    )
}

#[pg_guard]
unsafe extern "C-unwind" fn check_retry_window(
    newval: *mut *mut c_char,
    extra: *mut *mut c_void,
    _source: pg_sys::GucSource::Type,
) -> bool {
    check_interval(
        newval,
        extra,
        validate::retry_window,
        c"The value must be an interval of 1 second to 1 day.",
    )
}

type IntervalRule = fn(&'static str, i32, i32, i64) -> Result<(), crate::errors::IdemError>;

/// A GUC check hook's work: parse, apply `rule`, hand the parsed value to the assign hook.
unsafe fn check_interval(
    newval: *mut *mut c_char,
    extra: *mut *mut c_void,
    rule: IntervalRule,
    detail: &CStr,
) -> bool {
    if newval.is_null() || (*newval).is_null() {
        return false;
    }
    let Some(parsed) = parse_interval(CStr::from_ptr(*newval)) else {
        return false;
    };
    if rule("setting", parsed.months(), parsed.days(), parsed.micros()).is_err() {
        pg_sys::GUC_check_errdetail_string = pg_sys::pstrdup(detail.as_ptr());
        return false;
    }
    let slot = guc_extra(std::mem::size_of::<pg_sys::Interval>()) as *mut pg_sys::Interval;
    if slot.is_null() {
        return false;
    }
    slot.write(parsed.into_inner());
    *extra = slot.cast();
    true
}

/// Memory for a check hook's "extra" value, which the GUC machinery frees itself: with
/// free() up to PostgreSQL 15, with guc_free() (GUC's own memory context) from 16 on, so it
/// must come from malloc, or from guc_malloc. NULL when out of memory. One of the two places
/// that differ by major (the other: wakeup.rs's proc_of); suites build 15 and 18 only.
unsafe fn guc_extra(size: usize) -> *mut c_void {
    #[cfg(any(feature = "pg13", feature = "pg14", feature = "pg15"))]
    return libc::malloc(size);
    #[cfg(not(any(feature = "pg13", feature = "pg14", feature = "pg15")))]
    return pg_sys::guc_malloc(pg_sys::LOG as i32, size);
}

#[pg_guard]
unsafe extern "C-unwind" fn assign_default_ttl(_newval: *const c_char, extra: *mut c_void) {
    if !extra.is_null() {
        DEFAULT_TTL = *(extra as *const pg_sys::Interval);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn assign_default_lease(_newval: *const c_char, extra: *mut c_void) {
    if !extra.is_null() {
        DEFAULT_LEASE = *(extra as *const pg_sys::Interval);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn assign_tombstone_ttl(_newval: *const c_char, extra: *mut c_void) {
    if !extra.is_null() {
        TOMBSTONE_TTL = *(extra as *const pg_sys::Interval);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn assign_send_backoff_base(_newval: *const c_char, extra: *mut c_void) {
    if !extra.is_null() {
        SEND_BACKOFF_BASE = *(extra as *const pg_sys::Interval);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn assign_send_backoff_cap(_newval: *const c_char, extra: *mut c_void) {
    if !extra.is_null() {
        SEND_BACKOFF_CAP = *(extra as *const pg_sys::Interval);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn assign_send_retry_window(_newval: *const c_char, extra: *mut c_void) {
    if !extra.is_null() {
        SEND_RETRY_WINDOW = *(extra as *const pg_sys::Interval);
    }
}
