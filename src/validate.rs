//! Argument checks. Pure: every rule here is tested with a plain `cargo test`.

use pgrx::datum::Interval;

use crate::errors::IdemError;

/// Longest scope, key or message id, in characters. Two of them at four bytes a character
/// still fit a btree index entry.
pub const MAX_KEY_CHARS: usize = 255;

pub fn required<T>(arg: &'static str, value: Option<T>) -> Result<T, IdemError> {
    value.ok_or(IdemError::NullArgument { arg })
}

/// Scope, key and message id: 1 to 255 characters, no control characters.
pub fn key_text<'a>(arg: &'static str, value: Option<&'a str>) -> Result<&'a str, IdemError> {
    let value = required(arg, value)?;
    if value.is_empty() {
        return Err(IdemError::invalid(arg, "must not be empty"));
    }
    let mut chars = 0usize;
    for c in value.chars() {
        chars += 1;
        if c.is_control() {
            return Err(IdemError::invalid(
                arg,
                format!("must not contain control characters (found U+{:04X})", c as u32),
            ));
        }
    }
    if chars > MAX_KEY_CHARS {
        return Err(IdemError::invalid(
            arg,
            format!("must be at most {MAX_KEY_CHARS} characters (got {chars})"),
        ));
    }
    Ok(value)
}

/// An HTTP status code as stored with a response.
pub fn response_status(value: Option<i32>) -> Result<i32, IdemError> {
    let status = required("response_status", value)?;
    if !(100..=599).contains(&status) {
        return Err(IdemError::invalid(
            "response_status",
            format!("must be between 100 and 599 (got {status})"),
        ));
    }
    Ok(status)
}

/// A row budget for the maintenance functions.
pub fn max_rows(value: Option<i32>) -> Result<i64, IdemError> {
    let rows = required("max_rows", value)?;
    if rows <= 0 {
        return Err(IdemError::invalid("max_rows", format!("must be positive (got {rows})")));
    }
    Ok(rows as i64)
}

/// Longest ttl or lease. Far beyond any use, and it keeps now() + ttl inside the timestamp range.
pub const MAX_INTERVAL_YEARS: i128 = 10_000;

/// A ttl or lease must be longer than zero and at most MAX_INTERVAL_YEARS. Compared as
/// PostgreSQL compares intervals: a month counts 30 days and a day 24 hours.
pub fn positive_interval(arg: &'static str, months: i32, days: i32, micros: i64) -> Result<(), IdemError> {
    const DAY: i128 = 86_400_000_000;
    let total = months as i128 * 30 * DAY + days as i128 * DAY + micros as i128;
    if total <= 0 {
        return Err(IdemError::invalid(arg, "must be a positive interval"));
    }
    if total > MAX_INTERVAL_YEARS * 12 * 30 * DAY {
        return Err(IdemError::invalid(arg, format!("must be at most {MAX_INTERVAL_YEARS} years")));
    }
    Ok(())
}

/// Total length in microseconds, as PostgreSQL compares intervals (a month is 30 days).
fn total_micros(months: i32, days: i32, micros: i64) -> i128 {
    const DAY: i128 = 86_400_000_000;
    months as i128 * 30 * DAY + days as i128 * DAY + micros as i128
}

/// idempotency.tombstone_ttl: zero (off) or positive, at most MAX_INTERVAL_YEARS.
pub fn non_negative_interval(
    arg: &'static str,
    months: i32,
    days: i32,
    micros: i64,
) -> Result<(), IdemError> {
    if total_micros(months, days, micros) == 0 {
        return Ok(());
    }
    positive_interval(arg, months, days, micros).map_err(|_| {
        IdemError::invalid(
            arg,
            format!("must be zero or a positive interval of at most {MAX_INTERVAL_YEARS} years"),
        )
    })
}

/// idempotency.partition_period: 0 (no periods) or a fixed length (no months, whose length
/// varies) of 1 second to 366 days.
pub fn partition_period(arg: &'static str, months: i32, days: i32, micros: i64) -> Result<(), IdemError> {
    const SECOND: i128 = 1_000_000;
    let total = total_micros(months, days, micros);
    if total != 0 && (months != 0 || !(SECOND..=366 * 86_400 * SECOND).contains(&total)) {
        return Err(IdemError::invalid(
            arg,
            "must be 0 or a fixed length of 1 second to 366 days, no months",
        ));
    }
    Ok(())
}

/// Longest `wait` of idem_claim, in microseconds: one hour.
pub const MAX_WAIT_MICROS: i128 = 3_600_000_000;

/// idem_claim's `wait`: NULL or zero means answer at once (None); negative or over one
/// hour is refused. Returns the wait in microseconds.
pub fn wait_arg(value: Option<Interval>) -> Result<Option<i64>, IdemError> {
    value.map_or(Ok(None), |v| wait_micros(v.months(), v.days(), v.micros()))
}

/// `wait_arg` on an interval's parts.
pub fn wait_micros(months: i32, days: i32, micros: i64) -> Result<Option<i64>, IdemError> {
    let total = total_micros(months, days, micros);
    if total < 0 {
        return Err(IdemError::invalid("wait", "must not be negative"));
    }
    if total > MAX_WAIT_MICROS {
        return Err(IdemError::invalid("wait", "must be at most 1 hour"));
    }
    Ok(if total == 0 { None } else { Some(total as i64) })
}

/// Most ids idem_seen_many takes in one call.
pub const MAX_BATCH: usize = 10_000;

/// idem_seen_many's `message_ids`: not NULL, at most MAX_BATCH elements, each a valid key
/// (a NULL element is 22004, naming its position, 1-based as in SQL).
pub fn message_ids(ids: Option<Vec<Option<&str>>>) -> Result<Vec<&str>, IdemError> {
    let ids = required("message_ids", ids)?;
    if ids.len() > MAX_BATCH {
        return Err(IdemError::invalid(
            "message_ids",
            format!("must hold at most {MAX_BATCH} ids (got {})", ids.len()),
        ));
    }
    ids.into_iter()
        .enumerate()
        .map(|(i, id)| match id {
            None => Err(IdemError::NullElement { arg: "message_ids", position: i + 1 }),
            Some(id) => key_text("message_ids", Some(id)),
        })
        .collect()
}

/// A ttl or lease argument: `default()` (the setting) when NULL, else it must be positive.
pub fn interval_arg(
    arg: &'static str,
    value: Option<Interval>,
    default: fn() -> Interval,
) -> Result<Interval, IdemError> {
    match value {
        None => Ok(default()),
        Some(v) => positive_interval(arg, v.months(), v.days(), v.micros()).map(|_| v),
    }
}

/// A value to store must not be larger than `limit` bytes.
pub fn stored_size(arg: &'static str, size: usize, limit: usize) -> Result<(), IdemError> {
    if size > limit {
        return Err(IdemError::TooLarge { arg, size, limit });
    }
    Ok(())
}

/// response_headers, when given, is a JSON object of header name to value. `kind` is
/// jsonb_typeof's answer for the value.
pub fn headers_kind(kind: &str) -> Result<(), IdemError> {
    if kind != "object" {
        return Err(IdemError::invalid("response_headers", format!("must be a JSON object (got {kind})")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code<T: std::fmt::Debug>(r: Result<T, IdemError>) -> &'static str {
        r.expect_err("expected an error").sqlstate()
    }

    #[test]
    fn keys_accept_ordinary_text() {
        assert_eq!(key_text("key", Some("order-42")), Ok("order-42"));
        assert_eq!(key_text("key", Some("日本語 ✓ 'quoted' \\x00")), Ok("日本語 ✓ 'quoted' \\x00"));
        let longest = "k".repeat(MAX_KEY_CHARS);
        assert!(key_text("key", Some(&longest)).is_ok());
        let longest_multibyte = "é".repeat(MAX_KEY_CHARS);
        assert!(key_text("key", Some(&longest_multibyte)).is_ok());
    }

    #[test]
    fn keys_reject_null_empty_long_and_control() {
        assert_eq!(code(key_text("key", None)), "22004");
        assert_eq!(code(key_text("key", Some(""))), "22023");
        assert_eq!(code(key_text("key", Some(&"k".repeat(MAX_KEY_CHARS + 1)))), "22023");
        assert_eq!(code(key_text("key", Some("a\nb"))), "22023");
        assert_eq!(code(key_text("key", Some("tab\there"))), "22023");
        assert_eq!(code(key_text("key", Some("del\u{7f}"))), "22023");
        assert_eq!(code(key_text("key", Some("c1\u{85}"))), "22023");
    }

    #[test]
    fn errors_name_the_argument() {
        let e = key_text("scope", Some("")).unwrap_err();
        assert!(e.message().contains("\"scope\""), "{}", e.message());
        let e = key_text("message_id", Some(&"x".repeat(300))).unwrap_err();
        assert!(e.message().contains("\"message_id\"") && e.message().contains("300"));
    }

    #[test]
    fn response_status_is_an_http_status() {
        assert_eq!(response_status(Some(100)), Ok(100));
        assert_eq!(response_status(Some(599)), Ok(599));
        assert_eq!(code(response_status(Some(99))), "22023");
        assert_eq!(code(response_status(Some(600))), "22023");
        assert_eq!(code(response_status(Some(-201))), "22023");
        assert_eq!(code(response_status(None)), "22004");
    }

    #[test]
    fn intervals_must_be_positive() {
        assert!(positive_interval("ttl", 0, 0, 1).is_ok());
        assert!(positive_interval("ttl", 1, -29, 0).is_ok());
        assert_eq!(code(positive_interval("ttl", 0, 0, 0)), "22023");
        assert_eq!(code(positive_interval("lease", 0, 0, -1)), "22023");
        assert_eq!(code(positive_interval("ttl", 1, -30, 0)), "22023");
        assert_eq!(code(positive_interval("ttl", 0, 1, -86_400_000_000)), "22023");
        assert_eq!(code(positive_interval("ttl", i32::MIN, i32::MIN, i64::MIN)), "22023");
        assert!(positive_interval("ttl", 12 * 10_000, 0, 0).is_ok());
        assert_eq!(code(positive_interval("ttl", 12 * 10_000, 1, 0)), "22023");
        assert_eq!(code(positive_interval("lease", i32::MAX, i32::MAX, i64::MAX)), "22023");
        assert_eq!(code(positive_interval("ttl", 0, 0, i64::MAX)), "22023");
    }

    #[test]
    fn tombstone_ttl_may_be_zero() {
        assert!(non_negative_interval("tombstone_ttl", 0, 0, 0).is_ok());
        assert!(non_negative_interval("tombstone_ttl", 0, 7, 0).is_ok());
        assert_eq!(code(non_negative_interval("tombstone_ttl", 0, 0, -1)), "22023");
        assert_eq!(code(non_negative_interval("tombstone_ttl", i32::MAX, 0, 0)), "22023");
    }

    #[test]
    fn partition_periods_have_a_fixed_length() {
        assert!(partition_period("p", 0, 1, 0).is_ok());
        assert!(partition_period("p", 0, 0, 1_000_000).is_ok());
        assert!(partition_period("p", 0, 366, 0).is_ok());
        assert!(partition_period("p", 0, 0, 0).is_ok());
        assert_eq!(code(partition_period("p", 1, 0, 0)), "22023");
        assert_eq!(code(partition_period("p", 0, 0, 999_999)), "22023");
        assert_eq!(code(partition_period("p", 0, 367, 0)), "22023");
        assert_eq!(code(partition_period("p", 0, 0, -1)), "22023");
    }

    #[test]
    fn wait_is_zero_to_one_hour() {
        assert_eq!(wait_arg(None), Ok(None));
        assert_eq!(wait_micros(0, 0, 0), Ok(None));
        assert_eq!(wait_micros(0, 0, 5_000_000), Ok(Some(5_000_000)));
        assert_eq!(wait_micros(0, 0, 3_600_000_000), Ok(Some(3_600_000_000)));
        assert_eq!(code(wait_micros(0, 0, 3_600_000_001)), "22023");
        assert_eq!(code(wait_micros(0, 0, -1)), "22023");
        assert_eq!(code(wait_micros(0, 1, 0)), "22023");
        assert_eq!(wait_micros(1, -30, 1), Ok(Some(1)));
        let e = wait_micros(0, 0, -1).unwrap_err();
        assert!(e.message().contains("\"wait\""), "{}", e.message());
    }

    #[test]
    fn message_ids_are_keys_without_nulls() {
        assert_eq!(message_ids(Some(vec![])), Ok(vec![]));
        assert_eq!(message_ids(Some(vec![Some("a"), Some("a")])), Ok(vec!["a", "a"]));
        assert_eq!(code(message_ids(None)), "22004");
        let e = message_ids(Some(vec![Some("a"), None])).unwrap_err();
        assert_eq!(e.sqlstate(), "22004");
        assert!(e.message().contains("message_ids") && e.message().contains('2'), "{}", e.message());
        assert_eq!(code(message_ids(Some(vec![Some("")]))), "22023");
        let many = vec![Some("x"); MAX_BATCH + 1];
        assert_eq!(code(message_ids(Some(many))), "22023");
        assert_eq!(message_ids(Some(vec![Some("x"); MAX_BATCH])).map(|v| v.len()), Ok(MAX_BATCH));
    }

    #[test]
    fn max_rows_must_be_positive() {
        assert_eq!(max_rows(Some(1)), Ok(1));
        assert_eq!(code(max_rows(Some(0))), "22023");
        assert_eq!(code(max_rows(Some(-5))), "22023");
        assert_eq!(code(max_rows(None)), "22004");
    }

    #[test]
    fn stored_values_have_a_size_limit() {
        assert!(stored_size("response_body", 1024, 1024).is_ok());
        let e = stored_size("response_body", 1025, 1024).unwrap_err();
        assert_eq!(e.sqlstate(), "54000");
        assert!(e.message().contains("\"response_body\"") && e.message().contains("1025"));
    }

    #[test]
    fn headers_must_be_an_object() {
        assert!(headers_kind("object").is_ok());
        assert_eq!(code(headers_kind("array")), "22023");
        assert_eq!(code(headers_kind("string")), "22023");
    }
}
