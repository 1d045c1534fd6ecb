//! A sender's own settings, checked, as the values it sets in its transactions; its timeout
//! against its lease; and its waits between reconnections. No I/O.

use std::time::Duration;

/// The extension's limits of its settings (docs/reference.md): a budget of at most 1,000,000,
/// intervals of at most 10000 years, which PostgreSQL compares as 120000 months of 30 days.
pub const MAX_RETRY_BUDGET: f64 = 1_000_000.0;
pub const MAX_INTERVAL: Duration = Duration::from_secs(10_000 * 12 * 30 * 86_400);

/// Why a sender's settings were refused (the message says which and why).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingError(pub String);

/// An attempt that outlives its lease runs beside the attempt of the sender that takes the
/// send over: the timeout bounds each attempt and must end before the lease does.
pub fn check_timeout(timeout: Duration, lease: Duration) -> Result<(), SettingError> {
    if timeout.is_zero() {
        return Err(SettingError("the timeout must be above zero".into()));
    }
    if timeout >= lease {
        return Err(SettingError(format!(
            "the timeout ({timeout:?}) must be below the lease ({lease:?}): an attempt that outlives its lease runs \
             beside the attempt of the sender that takes the send over"
        )));
    }
    Ok(())
}

/// An interval setting's value: positive, at most [`MAX_INTERVAL`], to the microsecond (the
/// interval's resolution).
pub fn check_interval(name: &str, d: Duration) -> Result<Duration, SettingError> {
    if d < Duration::from_micros(1) || d > MAX_INTERVAL {
        return Err(SettingError(format!("{name} must be from 1 microsecond to 10000 years (got {d:?})")));
    }
    Ok(d)
}

/// The text of an interval setting, exact to the microsecond.
pub fn interval_text(d: Duration) -> String {
    format!("{}.{:06} seconds", d.as_secs(), d.subsec_micros())
}

/// The extension's settings a sender sets with `set_config(name, value, true)` in each of its
/// transactions, checked here (a value the database refuses would fail every call); those not
/// given stay the database's.
pub fn setting_values(
    retry_budget: Option<f64>,
    backoff_base: Option<Duration>,
    backoff_cap: Option<Duration>,
) -> Result<Vec<(&'static str, String)>, SettingError> {
    let mut values = Vec::new();
    if let Some(budget) = retry_budget {
        if !(0.0..=MAX_RETRY_BUDGET).contains(&budget) {
            return Err(SettingError(format!(
                "the retry budget must be a number from 0 to {MAX_RETRY_BUDGET} (got {budget})"
            )));
        }
        values.push(("idempotency.send_retry_budget", budget.to_string()));
    }
    if let Some(d) = backoff_base {
        values.push(("idempotency.send_backoff_base", interval_text(check_interval("backoff_base", d)?)));
    }
    if let Some(d) = backoff_cap {
        values.push(("idempotency.send_backoff_cap", interval_text(check_interval("backoff_cap", d)?)));
    }
    Ok(values)
}

/// The wait after the `failures`-th database error in a row: exponential backoff with full
/// jitter, `fraction` (uniform in [0, 1)) of min(cap, base * 2^(failures - 1)).
pub fn reconnect_delay(failures: u32, base: Duration, cap: Duration, fraction: f64) -> Duration {
    let bound = base.saturating_mul(1u32 << failures.saturating_sub(1).min(31)).min(cap);
    bound.mul_f64(fraction.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timeout_must_be_below_the_lease() {
        let s = Duration::from_secs;
        assert!(check_timeout(s(1), s(2)).is_ok());
        assert!(check_timeout(Duration::from_millis(1500), Duration::from_millis(1500)).is_err());
        assert!(check_timeout(s(3), s(2)).is_err());
        assert!(check_timeout(Duration::ZERO, s(2)).is_err());
    }

    #[test]
    fn settings_are_checked_and_written_exactly() {
        let v = setting_values(Some(0.0), Some(Duration::from_millis(10)), Some(Duration::from_secs(600)))
            .unwrap();
        assert_eq!(
            v,
            vec![
                ("idempotency.send_retry_budget", "0".to_owned()),
                ("idempotency.send_backoff_base", "0.010000 seconds".to_owned()),
                ("idempotency.send_backoff_cap", "600.000000 seconds".to_owned()),
            ]
        );
        assert_eq!(setting_values(Some(1_000_000.0), None, None).unwrap()[0].1, "1000000");
        assert_eq!(setting_values(Some(0.1), None, None).unwrap()[0].1, "0.1");
        assert!(setting_values(None, None, None).unwrap().is_empty());
        for bad in [-0.5, 1_000_000.5, f64::NAN, f64::INFINITY] {
            assert!(setting_values(Some(bad), None, None).is_err(), "{bad}");
        }
        assert!(setting_values(None, Some(Duration::from_nanos(999)), None).is_err());
        assert!(setting_values(None, None, Some(MAX_INTERVAL + Duration::from_secs(1))).is_err());
        assert_eq!(interval_text(Duration::from_micros(1_500_001)), "1.500001 seconds");
    }

    #[test]
    fn reconnect_delays_grow_to_the_cap_with_full_jitter() {
        let (base, cap) = (Duration::from_millis(100), Duration::from_secs(5));
        assert_eq!(reconnect_delay(1, base, cap, 1.0), Duration::from_millis(100));
        assert_eq!(reconnect_delay(3, base, cap, 1.0), Duration::from_millis(400));
        assert_eq!(reconnect_delay(10, base, cap, 1.0), cap);
        assert_eq!(reconnect_delay(10_000, base, cap, 1.0), cap);
        assert_eq!(reconnect_delay(3, base, cap, 0.5), Duration::from_millis(200));
        assert_eq!(reconnect_delay(3, base, cap, 0.0), Duration::ZERO);
    }
}
