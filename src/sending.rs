//! The sending side's rules (docs/sending.md) as the native idem_send_next and
//! idem_send_result apply them. Pure: tested with a plain `cargo test`. The portable edition
//! applies the same rules in sql/send.sql; errors carry the same SQLSTATEs and words.

use crate::errors::IdemError;
use crate::validate::{self, MAX_INTERVAL_YEARS};

/// Most sends one idem_send_next hands out.
pub const MAX_TAKE_ROWS: i32 = 10_000;

/// Most rows past give_up_at that one idem_send_next marks gave_up per target.
pub const MAX_GIVE_UPS: i64 = 1_000;

const DAY: i128 = 86_400_000_000;

/// An interval's length as PostgreSQL compares intervals (a month is 30 days, a day 24 hours).
fn total_micros(months: i32, days: i32, micros: i64) -> i128 {
    months as i128 * 30 * DAY + days as i128 * DAY + micros as i128
}

const MAX_TOTAL: i128 = MAX_INTERVAL_YEARS * 12 * 30 * DAY;

/// idem_send_next's `max_rows`: 1 to MAX_TAKE_ROWS.
pub fn max_rows(value: Option<i32>) -> Result<i32, IdemError> {
    let rows = validate::required("max_rows", value)?;
    if !(1..=MAX_TAKE_ROWS).contains(&rows) {
        return Err(IdemError::invalid(
            "max_rows",
            format!("must be between 1 and {MAX_TAKE_ROWS} (got {rows})"),
        ));
    }
    Ok(rows)
}

/// idem_send_next's `lease`, when given: positive, at most 10000 years. `shown` prints the
/// value as the server does (for the message).
pub fn lease(months: i32, days: i32, micros: i64, shown: impl FnOnce() -> String) -> Result<(), IdemError> {
    let total = total_micros(months, days, micros);
    if total <= 0 || total > MAX_TOTAL {
        return Err(IdemError::invalid(
            "lease",
            format!("{} (it must be a positive interval of at most {MAX_INTERVAL_YEARS} years)", shown()),
        ));
    }
    Ok(())
}

/// idem_send_result's `retry_after`, when given: 0 to 10000 years.
pub fn retry_after(
    months: i32,
    days: i32,
    micros: i64,
    shown: impl FnOnce() -> String,
) -> Result<(), IdemError> {
    let total = total_micros(months, days, micros);
    if !(0..=MAX_TOTAL).contains(&total) {
        return Err(IdemError::invalid(
            "retry_after",
            format!("{} (it must be an interval of 0 to {MAX_INTERVAL_YEARS} years)", shown()),
        ));
    }
    Ok(())
}

/// idem_send_result's `http_status`: NULL (no answer) or 100 to 599.
pub fn http_status(value: Option<i32>) -> Result<Option<i32>, IdemError> {
    match value {
        Some(status) if !(100..=599).contains(&status) => {
            Err(IdemError::invalid("http_status", format!("must be between 100 and 599 (got {status})")))
        }
        _ => Ok(value),
    }
}

/// idem_send_next's `scope` and `operation`: both (the inline path: that one send) or neither.
pub fn one_send<'a>(
    scope: Option<&'a str>,
    operation: Option<&'a str>,
) -> Result<Option<(&'a str, &'a str)>, IdemError> {
    match (scope, operation) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(IdemError::NullWhenGiven { arg: "scope", other: "operation" }),
        (Some(_), None) => Err(IdemError::NullWhenGiven { arg: "operation", other: "scope" }),
        (Some(s), Some(o)) => {
            Ok(Some((validate::key_text("scope", Some(s))?, validate::key_text("operation", Some(o))?)))
        }
    }
}

/// Whether an attempt's answer asks for another attempt: no answer at all (refused, reset,
/// timed out), or a status that says "not now" rather than "no".
pub fn retryable(http_status: Option<i32>) -> bool {
    match http_status {
        None => true,
        Some(status) => matches!(status, 408 | 409 | 425 | 429 | 500 | 502 | 503 | 504),
    }
}

/// The width of the retry budget's buckets in microseconds: idempotency.send_retry_window / 60,
/// as PostgreSQL divides the interval (interval_div) and date_bin then measures it. The window
/// is 1 second to 1 day, so it has no months.
pub fn bucket_width(days: i32, micros: i64) -> i64 {
    const SECS_PER_DAY: f64 = 86_400.0;
    let whole_days = (days as f64 / 60.0) as i64; // 0: a window is at most a day
    let day_part = days as f64 / 60.0 - whole_days as f64;
    // TSROUND: to the microsecond.
    let sec_remainder = (day_part * SECS_PER_DAY * 1e6).round_ties_even() / 1e6;
    let time = (micros as f64 / 60.0 + sec_remainder * 1e6).round_ties_even() as i64;
    whole_days * 86_400_000_000 + time
}

/// The bucket a count made at `now` (microseconds since 2000-01-01, as PostgreSQL keeps
/// timestamps) belongs to: date_bin(width, now, '2000-01-01'), the start of the bucket.
pub fn bucket_of(now: i64, width: i64) -> i64 {
    now - now.rem_euclid(width)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code<T: std::fmt::Debug>(r: Result<T, IdemError>) -> &'static str {
        r.unwrap_err().sqlstate()
    }

    #[test]
    fn max_rows_is_1_to_10000() {
        assert_eq!(max_rows(Some(1)), Ok(1));
        assert_eq!(max_rows(Some(10_000)), Ok(10_000));
        assert_eq!(code(max_rows(None)), "22004");
        let e = max_rows(Some(0)).unwrap_err();
        assert_eq!(e.message(), "invalid argument \"max_rows\": must be between 1 and 10000 (got 0)");
        assert_eq!(code(max_rows(Some(10_001))), "22023");
    }

    #[test]
    fn lease_is_positive_and_at_most_10000_years() {
        let shown = || "00:00:00".to_string();
        assert!(lease(0, 0, 1, shown).is_ok());
        let e = lease(0, 0, 0, shown).unwrap_err();
        assert_eq!(e.sqlstate(), "22023");
        assert_eq!(
            e.message(),
            "invalid argument \"lease\": 00:00:00 (it must be a positive interval of at most 10000 years)"
        );
        assert!(lease(120_000, 0, 0, shown).is_ok());
        assert!(lease(120_000, 0, 1, shown).is_err());
        assert!(lease(1, -31, 0, shown).is_err());
    }

    #[test]
    fn retry_after_is_0_to_10000_years() {
        let shown = || "-00:00:01".to_string();
        assert!(retry_after(0, 0, 0, shown).is_ok());
        let e = retry_after(0, 0, -1_000_000, shown).unwrap_err();
        assert_eq!(
            e.message(),
            "invalid argument \"retry_after\": -00:00:01 (it must be an interval of 0 to 10000 years)"
        );
        assert!(retry_after(120_001, 0, 0, shown).is_err());
    }

    #[test]
    fn http_status_is_null_or_100_to_599() {
        assert_eq!(http_status(None), Ok(None));
        assert_eq!(http_status(Some(100)), Ok(Some(100)));
        assert_eq!(http_status(Some(599)), Ok(Some(599)));
        let e = http_status(Some(99)).unwrap_err();
        assert_eq!(e.message(), "invalid argument \"http_status\": must be between 100 and 599 (got 99)");
        assert_eq!(code(http_status(Some(600))), "22023");
    }

    #[test]
    fn scope_and_operation_go_together() {
        assert_eq!(one_send(None, None), Ok(None));
        assert_eq!(one_send(Some("s"), Some("o")), Ok(Some(("s", "o"))));
        let e = one_send(None, Some("o")).unwrap_err();
        assert_eq!(e.message(), "argument \"scope\" must not be null when \"operation\" is given");
        let e = one_send(Some("s"), None).unwrap_err();
        assert_eq!(e.message(), "argument \"operation\" must not be null when \"scope\" is given");
        assert_eq!(code(one_send(Some(""), Some("o"))), "22023");
        assert_eq!(code(one_send(Some("s"), Some("a\u{1}"))), "22023");
    }

    #[test]
    fn retryable_answers_are_no_answer_and_the_not_now_statuses() {
        assert!(retryable(None));
        for s in [408, 409, 425, 429, 500, 502, 503, 504] {
            assert!(retryable(Some(s)), "{s}");
        }
        for s in [200, 201, 204, 301, 400, 401, 404, 410, 422, 501, 505] {
            assert!(!retryable(Some(s)), "{s}");
        }
    }

    #[test]
    fn buckets_are_a_sixtieth_of_the_window() {
        // '1 minute', '3 s', '20 s' (SELECT interval '20 s' / 60: 00:00:00.333333), '1 day'
        // (interval_div carries the day's sixtieth into the time: 00:24:00), '24 hours'.
        assert_eq!(bucket_width(0, 60_000_000), 1_000_000);
        assert_eq!(bucket_width(0, 3_000_000), 50_000);
        assert_eq!(bucket_width(0, 20_000_000), 333_333);
        assert_eq!(bucket_width(1, 0), 1_440_000_000);
        assert_eq!(bucket_width(0, 86_400_000_000), 1_440_000_000);
        assert_eq!(bucket_width(1, -3_600_000_000), 1_380_000_000);
    }

    #[test]
    fn a_bucket_starts_at_a_multiple_of_its_width_since_2000() {
        assert_eq!(bucket_of(0, 1_000_000), 0);
        assert_eq!(bucket_of(2_500_000, 1_000_000), 2_000_000);
        assert_eq!(bucket_of(2_000_000, 1_000_000), 2_000_000);
        assert_eq!(bucket_of(-1, 1_000_000), -1_000_000);
    }
}
