//! idem_claim. One read of (scope, key) answers `replay`, `in_progress` and `mismatch`
//! with nothing written; only a claim that goes ahead writes: an insert, the replacement
//! of an expired record, or the takeover of a claim whose lease ended. A write that finds
//! the record changed under it (ON CONFLICT, or a fence on the token it read) reads again.

use pgrx::datum::{Interval, TimestampWithTimeZone, Uuid};
use pgrx::heap_tuple::PgHeapTuple;
use pgrx::pg_sys::{self, INT4OID, TEXTOID, TIMESTAMPTZOID, UUIDOID};
use pgrx::prelude::*;
use pgrx::spi::{SpiClient, SpiTupleTable};
use pgrx::{AllocatedByRust, IntoDatum, PgTupleDesc};

use crate::errors::{IdemError, OrRaise};
use crate::jsonb::Jsonb;
use crate::record::{Outcome, Status};
use crate::spi::{self, get, get_not_null, Kind, Statement};
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
    columns: &[
        "fingerprint",
        "status",
        "token",
        "attempts",
        "locked_until",
        "expires_at",
        "response_status",
        "response_headers",
        "response_body",
    ],
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
    columns: &[],
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
    args: &[TEXTOID, TEXTOID, TEXTOID, UUIDOID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID, UUIDOID],
    kind: Kind::Write,
    columns: &[],
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
    args: &[TEXTOID, TEXTOID, UUIDOID, INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID, UUIDOID],
    kind: Kind::Write,
    columns: &["recovery_point", "recovery_data"],
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
    claim(scope, key, fingerprint, ttl, lease).or_raise().into_tuple(fcinfo)
}

/// The columns of READ that decide the answer.
struct Stored {
    fingerprint: Option<String>,
    status: Status,
    token: Uuid,
    attempts: i32,
    locked_until: Option<TimestampWithTimeZone>,
    expires_at: TimestampWithTimeZone,
}

impl Stored {
    fn read(row: &SpiTupleTable<'_>) -> Self {
        let status: String = get_not_null(row, &READ, "status");
        Stored {
            fingerprint: get(row, &READ, "fingerprint"),
            // The functions write only the two statuses; any other (written by hand) is not completed.
            status: Status::parse(&status).unwrap_or(Status::InProgress),
            token: get_not_null(row, &READ, "token"),
            attempts: get_not_null(row, &READ, "attempts"),
            locked_until: get(row, &READ, "locked_until"),
            expires_at: get_not_null(row, &READ, "expires_at"),
        }
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
    let ttl = validate::interval_arg("ttl", ttl, settings::default_ttl)?;
    let lease = validate::interval_arg("lease", lease, settings::default_lease)?;
    spi::require_primary("idem_claim")?;
    let now = spi::now();
    let expires_at = now + ttl;
    let lease_end = now + lease;

    Spi::connect_mut(|client| {
        // A new claim of the free key: an INSERT, or the replacement of the expired record
        // that carried token `expired`. None when another transaction changed the key first.
        let new_claim = |client: &mut SpiClient<'_>, expired: Option<Uuid>| {
            let token = spi::new_token();
            let args = [
                scope.into(),
                key.into(),
                fingerprint.into(),
                token.into(),
                lease_end.into(),
                now.into(),
                expires_at.into(),
                expired.into(),
            ];
            let (stmt, args) =
                if expired.is_some() { (&REPLACE_EXPIRED, &args[..]) } else { (&INSERT, &args[..7]) };
            spi::run(client, stmt, args);
            (spi::processed() == 1)
                .then(|| Answer::claimed(Outcome::Claimed, token, 1, lease_end, expires_at, None, None))
        };
        for _ in 0..MAX_ROUNDS {
            let found = spi::run(client, &READ, &[scope.into(), key.into()]);
            if found.is_empty() {
                match new_claim(client, None) {
                    Some(answer) => return Ok(answer),
                    None => continue, // another transaction inserted it first: read what it left
                }
            }

            let row = found.first();
            let stored = Stored::read(&row);
            if stored.expires_at <= now {
                match new_claim(client, Some(stored.token)) {
                    Some(answer) => return Ok(answer),
                    None => continue,
                }
            }

            if stored.fingerprint.as_deref() != fingerprint {
                return Ok(Answer::mismatch(stored.expires_at));
            }
            if stored.status == Status::Completed {
                let response_status: Option<i32> = get(&row, &READ, "response_status");
                return Ok(Answer {
                    http_status: response_status,
                    response_status,
                    response_headers: get(&row, &READ, "response_headers"),
                    response_body: get(&row, &READ, "response_body"),
                    attempts: Some(stored.attempts),
                    expires_at: Some(stored.expires_at),
                    ..Answer::empty(Outcome::Replay)
                });
            }
            let locked_until = stored.locked_until.expect("in_progress has a lease");
            if locked_until > now {
                return Ok(Answer {
                    http_status: Some(409),
                    attempts: Some(stored.attempts),
                    expires_at: Some(stored.expires_at),
                    locked_until: Some(locked_until),
                    ..Answer::empty(Outcome::InProgress)
                });
            }

            // The owner's lease ended: take the claim over, fenced on the token we read.
            let token = spi::new_token();
            let attempts = stored.attempts + 1;
            let new_expires = if stored.expires_at > expires_at { stored.expires_at } else { expires_at };
            let taken = spi::run(
                client,
                &TAKE_OVER,
                &[
                    scope.into(),
                    key.into(),
                    token.into(),
                    attempts.into(),
                    lease_end.into(),
                    now.into(),
                    new_expires.into(),
                    stored.token.into(),
                ],
            );
            if !taken.is_empty() {
                let taken = taken.first();
                return Ok(Answer::claimed(
                    Outcome::Reclaimed,
                    token,
                    attempts,
                    lease_end,
                    new_expires,
                    get(&taken, &TAKE_OVER, "recovery_point"),
                    get(&taken, &TAKE_OVER, "recovery_data"),
                ));
            }
        }
        Err(IdemError::ClaimContended { scope: scope.to_string(), key: key.to_string() })
    })
}

/// One `idempotency.claim_result`, before it becomes a tuple.
struct Answer {
    outcome: Outcome,
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
    /// An answer of `outcome` with every other column NULL.
    fn empty(outcome: Outcome) -> Self {
        Answer {
            outcome,
            token: None,
            http_status: None,
            response_status: None,
            response_headers: None,
            response_body: None,
            recovery_point: None,
            recovery_data: None,
            attempts: None,
            expires_at: None,
            locked_until: None,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn claimed(
        outcome: Outcome,
        token: Uuid,
        attempts: i32,
        locked_until: TimestampWithTimeZone,
        expires_at: TimestampWithTimeZone,
        recovery_point: Option<String>,
        recovery_data: Option<Jsonb>,
    ) -> Self {
        Answer {
            token: Some(token),
            attempts: Some(attempts),
            locked_until: Some(locked_until),
            expires_at: Some(expires_at),
            recovery_point,
            recovery_data,
            ..Answer::empty(outcome)
        }
    }

    fn mismatch(expires_at: TimestampWithTimeZone) -> Self {
        Answer { http_status: Some(422), expires_at: Some(expires_at), ..Answer::empty(Outcome::Mismatch) }
    }

    fn into_tuple(self, fcinfo: pg_sys::FunctionCallInfo) -> PgHeapTuple<'static, AllocatedByRust> {
        let datums = [
            self.outcome.as_str().into_datum(),
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
            assert_eq!(
                class,
                pg_sys::TypeFuncClass::TYPEFUNC_COMPOSITE,
                "claim_result must be a composite type"
            );
            PgHeapTuple::from_datums(PgTupleDesc::from_pg_unchecked(tupdesc), datums)
                .expect("claim_result has the columns idem_claim fills")
        }
    }
}
