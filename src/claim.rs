//! idem_claim. One read of (scope, key) answers `replay`, `in_progress` and `mismatch`
//! with nothing written; only a claim that goes ahead writes: an insert, the replacement
//! of an expired record, or the takeover of a claim whose lease ended. A write that finds
//! the record changed under it (ON CONFLICT, or a fence on the token it read) reads again.

use pgrx::datum::{Interval, TimestampWithTimeZone, Uuid};
use pgrx::heap_tuple::PgHeapTuple;
use pgrx::pg_sys::{self, INT4OID, TEXTOID, TIMESTAMPTZOID, UUIDOID};
use pgrx::prelude::*;
use pgrx::{AllocatedByRust, IntoDatum, PgTupleDesc};

use crate::errors::{raise, IdemError};
use crate::jsonb::Jsonb;
use crate::spi::{self, col, Kind, Statement};
use crate::{settings, validate};

/// Rounds of read-then-write before giving up with 40001. Each lost round means another
/// transaction changed this very key between our read and our write.
const MAX_ROUNDS: usize = 10;

static READ: Statement = Statement {
    sql: "SELECT fingerprint, status, token, attempts, locked_until, expires_at, \
                 response_status, response_headers, response_body \
          FROM idempotency.keys \
          WHERE scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2",
    args: &[TEXTOID, TEXTOID],
    kind: Kind::Read,
};

// $1 scope, $2 key, $3 fingerprint, $4 token, $5 locked_until, $6 now, $7 expires_at
static INSERT: Statement = Statement {
    sql: "INSERT INTO idempotency.keys \
              (scope, key, fingerprint, status, token, attempts, locked_until, \
               created_at, updated_at, expires_at) \
          VALUES ($1, $2, $3, 'in_progress', $4, 1, $5, $6, $6, $7) \
          ON CONFLICT (scope, key) DO NOTHING",
    args: &[TEXTOID, TEXTOID, TEXTOID, UUIDOID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID],
    kind: Kind::Write,
};

// Same parameters as INSERT, plus $8 the token of the expired record that was read.
static REPLACE_EXPIRED: Statement = Statement {
    sql: "UPDATE idempotency.keys \
          SET fingerprint = $3, status = 'in_progress', token = $4, attempts = 1, \
              locked_until = $5, recovery_point = NULL, recovery_data = NULL, \
              response_status = NULL, response_headers = NULL, response_body = NULL, \
              created_at = $6, updated_at = $6, completed_at = NULL, expires_at = $7 \
          WHERE scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2 \
            AND token OPERATOR(pg_catalog.=) $8 \
            AND expires_at OPERATOR(pg_catalog.<=) $6",
    args: &[
        TEXTOID, TEXTOID, TEXTOID, UUIDOID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID,
        UUIDOID,
    ],
    kind: Kind::Write,
};

// $1 scope, $2 key, $3 new token, $4 attempts, $5 locked_until, $6 now, $7 expires_at,
// $8 the token that was read: the takeover is fenced on it and on the lease having ended.
static TAKE_OVER: Statement = Statement {
    sql: "UPDATE idempotency.keys \
          SET token = $3, attempts = $4, locked_until = $5, updated_at = $6, expires_at = $7 \
          WHERE scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2 \
            AND token OPERATOR(pg_catalog.=) $8 \
            AND status OPERATOR(pg_catalog.=) 'in_progress' \
            AND locked_until OPERATOR(pg_catalog.<=) $6 \
            AND expires_at OPERATOR(pg_catalog.>) $6 \
          RETURNING recovery_point, recovery_data",
    args: &[
        TEXTOID, TEXTOID, UUIDOID, INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID,
        UUIDOID,
    ],
    kind: Kind::Write,
};

#[pg_extern(volatile, parallel_unsafe)]
fn idem_claim(
    fcinfo: pg_sys::FunctionCallInfo,
    scope: Option<&str>,
    key: Option<&str>,
    fingerprint: default!(Option<&str>, "NULL"),
    ttl: default!(Option<Interval>, "NULL"),
    lease: default!(Option<Interval>, "NULL"),
) -> pgrx::composite_type!('static, "idempotency.claim_result") {
    match claim(scope, key, fingerprint, ttl, lease) {
        Ok(answer) => answer.into_tuple(fcinfo),
        Err(e) => raise(e),
    }
}

/// A ttl or lease argument: the setting when NULL, else it must be positive.
pub fn interval_arg(
    arg: &'static str,
    value: Option<Interval>,
    default: fn() -> Interval,
) -> Result<Interval, IdemError> {
    match value {
        None => Ok(default()),
        Some(v) => validate::positive_interval(arg, v.months(), v.days(), v.micros()).map(|_| v),
    }
}

fn claim(
    scope: Option<&str>,
    key: Option<&str>,
    fingerprint: Option<&str>,
    ttl: Option<Interval>,
    lease: Option<Interval>,
) -> Result<Answer, IdemError> {
    let scope = validate::key_text("scope", scope)?;
    let key = validate::key_text("key", key)?;
    let ttl = interval_arg("ttl", ttl, settings::default_ttl)?;
    let lease = interval_arg("lease", lease, settings::default_lease)?;
    spi::require_primary("idem_claim")?;
    let now = spi::now();
    let expires_at = now + ttl;
    let lease_end = now + lease;

    Spi::connect_mut(|client| {
        for _ in 0..MAX_ROUNDS {
            let found = spi::run(client, &READ, &[scope.into(), key.into()]);
            if found.is_empty() {
                let token = spi::new_token();
                spi::run(
                    client,
                    &INSERT,
                    &[
                        scope.into(), key.into(), fingerprint.into(), token.into(),
                        lease_end.into(), now.into(), expires_at.into(),
                    ],
                );
                if spi::processed() == 1 {
                    return Ok(Answer::claimed("claimed", token, 1, lease_end, expires_at, None, None));
                }
                continue; // another transaction inserted it first: read what it left
            }

            let row = found.first();
            let read_token: Uuid = col(&row, 3).expect("token is NOT NULL");
            let record_expires: TimestampWithTimeZone = col(&row, 6).expect("expires_at is NOT NULL");
            if record_expires <= now {
                let token = spi::new_token();
                spi::run(
                    client,
                    &REPLACE_EXPIRED,
                    &[
                        scope.into(), key.into(), fingerprint.into(), token.into(),
                        lease_end.into(), now.into(), expires_at.into(), read_token.into(),
                    ],
                );
                if spi::processed() == 1 {
                    return Ok(Answer::claimed("claimed", token, 1, lease_end, expires_at, None, None));
                }
                continue;
            }

            let stored_fingerprint: Option<String> = col(&row, 1);
            let attempts: i32 = col(&row, 4).expect("attempts is NOT NULL");
            if stored_fingerprint.as_deref() != fingerprint {
                return Ok(Answer::mismatch(record_expires));
            }
            let status: String = col(&row, 2).expect("status is NOT NULL");
            if status == "completed" {
                return Ok(Answer {
                    outcome: "replay",
                    http_status: col(&row, 7),
                    response_status: col(&row, 7),
                    response_headers: col(&row, 8),
                    response_body: col(&row, 9),
                    attempts: Some(attempts),
                    expires_at: Some(record_expires),
                    ..Answer::default()
                });
            }
            let locked_until: TimestampWithTimeZone = col(&row, 5).expect("in_progress has a lease");
            if locked_until > now {
                return Ok(Answer {
                    outcome: "in_progress",
                    http_status: Some(409),
                    attempts: Some(attempts),
                    expires_at: Some(record_expires),
                    locked_until: Some(locked_until),
                    ..Answer::default()
                });
            }

            // The owner's lease ended: take the claim over, fenced on the token we read.
            let token = spi::new_token();
            let new_expires = if record_expires > expires_at { record_expires } else { expires_at };
            let taken = spi::run(
                client,
                &TAKE_OVER,
                &[
                    scope.into(), key.into(), token.into(), (attempts + 1).into(),
                    lease_end.into(), now.into(), new_expires.into(), read_token.into(),
                ],
            );
            if !taken.is_empty() {
                let taken = taken.first();
                return Ok(Answer::claimed(
                    "reclaimed",
                    token,
                    attempts + 1,
                    lease_end,
                    new_expires,
                    col(&taken, 1),
                    col(&taken, 2),
                ));
            }
        }
        Err(IdemError::ClaimContended { scope: scope.to_string(), key: key.to_string() })
    })
}

/// One `idempotency.claim_result`, before it becomes a tuple.
#[derive(Default)]
struct Answer {
    outcome: &'static str,
    token: Option<Uuid>,
    http_status: Option<i32>,
    response_status: Option<i32>,
    response_headers: Option<Jsonb>,
    response_body: Option<Jsonb>,
    recovery_point: Option<String>,
    recovery_data: Option<Jsonb>,
    attempts: Option<i32>,
    expires_at: Option<TimestampWithTimeZone>,
    locked_until: Option<TimestampWithTimeZone>,
}

impl Answer {
    fn claimed(
        outcome: &'static str,
        token: Uuid,
        attempts: i32,
        locked_until: TimestampWithTimeZone,
        expires_at: TimestampWithTimeZone,
        recovery_point: Option<String>,
        recovery_data: Option<Jsonb>,
    ) -> Self {
        Answer {
            outcome,
            token: Some(token),
            attempts: Some(attempts),
            locked_until: Some(locked_until),
            expires_at: Some(expires_at),
            recovery_point,
            recovery_data,
            ..Answer::default()
        }
    }

    fn mismatch(expires_at: TimestampWithTimeZone) -> Self {
        Answer { outcome: "mismatch", http_status: Some(422), expires_at: Some(expires_at), ..Answer::default() }
    }

    fn into_tuple(self, fcinfo: pg_sys::FunctionCallInfo) -> PgHeapTuple<'static, AllocatedByRust> {
        let datums = [
            self.outcome.into_datum(),
            self.token.into_datum(),
            self.http_status.into_datum(),
            self.response_status.into_datum(),
            self.response_headers.into_datum(),
            self.response_body.into_datum(),
            self.recovery_point.into_datum(),
            self.recovery_data.into_datum(),
            self.attempts.into_datum(),
            self.expires_at.into_datum(),
            self.locked_until.into_datum(),
        ];
        // SAFETY: fcinfo is this call's; get_call_result_type gives the declared result
        // type's descriptor (claim_result), allocated for this call; the datums match it
        // column by column.
        unsafe {
            let mut tupdesc: pg_sys::TupleDesc = std::ptr::null_mut();
            let class = pg_sys::get_call_result_type(fcinfo, std::ptr::null_mut(), &mut tupdesc);
            assert_eq!(class, pg_sys::TypeFuncClass::TYPEFUNC_COMPOSITE, "claim_result must be a composite type");
            PgHeapTuple::from_datums(PgTupleDesc::from_pg_unchecked(tupdesc), datums)
                .expect("claim_result has the columns idem_claim fills")
        }
    }
}
