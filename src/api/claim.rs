//! idem_claim. One read of (scope, key) answers `replay`, `in_progress` and `mismatch`
//! with nothing written; only a claim that goes ahead writes: an insert, the replacement
//! of an expired record, or the takeover of a claim whose lease ended. A write that finds
//! the record changed under it (ON CONFLICT, or a fence on the token it read) reads again.
//!
//! Second round: a caller-chosen `token` makes a repeated claim answer `claimed` again
//! (nothing written); with `idempotency.tombstone_ttl` on, an expired completed record
//! answers `expired` until its tombstone ends; a positive `wait` turns an `in_progress`
//! answer into a wait for the owner's record to change (src/api/wait.rs).

use pgrx::datum::{Interval, TimestampWithTimeZone, Uuid};
use pgrx::pg_sys::{self, INT4OID, TEXTOID, TIMESTAMPTZOID, UUIDOID};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

use crate::api::claim_result::Answer;
use crate::api::wait;
use crate::direct::{self, Table};
use crate::errors::{IdemError, OrRaise};
use crate::record::{Outcome, Status};
use crate::spi::{self, get, get_not_null, Columns, Kind, Statement};
use crate::{settings, validate};

/// Rounds of read-then-write before giving up with 40001. Each lost round means another
/// transaction changed this very key between our read and our write.
const MAX_ROUNDS: usize = 10;

static READ: Statement = Statement {
    sql: "SELECT fingerprint, status, token, attempts, locked_until, expires_at, \
                 response_status, response_headers, response_body, recovery_point, recovery_data \
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
        "recovery_point",
        "recovery_data",
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

// SQL's idem_claim (since 0.4.0, with wait and token). Its C symbol is new
// (idem_claim_wait_token_wrapper): the five-argument idem_claim of older releases calls
// idem_claim_wrapper, which src/api/compat.rs keeps.
#[pg_extern(volatile, parallel_unsafe, name = "idem_claim")]
#[allow(clippy::too_many_arguments)]
fn idem_claim_wait_token(
    fcinfo: pg_sys::FunctionCallInfo,
    scope: Option<&str>,
    key: Option<&str>,
    fingerprint: default!(Option<&str>, "NULL"),
    ttl: default!(Option<Interval>, "NULL"),
    lease: default!(Option<Interval>, "NULL"),
    wait: default!(Option<Interval>, "NULL"),
    token: default!(Option<Uuid>, "NULL"),
) -> pgrx::composite_type!('static, "idempotency.claim_result") {
    claim(scope, key, fingerprint, ttl, lease, wait, token).or_raise().into_tuple(fcinfo)
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
    fn read(row: &impl Columns) -> Self {
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

/// What a read of (scope, key) leads to.
enum Next {
    /// The answer, with nothing to write.
    Answer(Answer),
    /// The key is free: a new claim, inserted, or replacing the expired record that carried
    /// token `expired`.
    NewClaim { expired: Option<Uuid> },
    /// The owner's lease ended: take the claim over, fenced on the token that was read.
    TakeOver { read_token: Uuid, attempts: i32, expires_at: TimestampWithTimeZone },
}

/// What a claim asks for, checked.
struct Request<'a> {
    scope: &'a str,
    key: &'a str,
    fingerprint: Option<&'a str>,
    ttl: Interval,
    lease: Interval,
    /// The caller's token, stored by a new claim or a takeover.
    token: Option<Uuid>,
}

/// idem_claim with its arguments as SQL passed them (also the compat symbol's body).
pub(super) fn claim(
    scope: Option<&str>,
    key: Option<&str>,
    fingerprint: Option<&str>,
    ttl: Option<Interval>,
    lease: Option<Interval>,
    wait: Option<Interval>,
    token: Option<Uuid>,
) -> Result<Answer, IdemError> {
    let request = Request {
        scope: validate::key_text("scope", scope)?,
        key: validate::key_text("key", key)?,
        fingerprint,
        ttl: validate::interval_arg("ttl", ttl, settings::default_ttl)?,
        lease: validate::interval_arg("lease", lease, settings::default_lease)?,
        token,
    };
    let wait = validate::wait_arg(wait)?;
    spi::require_primary("idem_claim")?;
    let answer = claim_at(&request, spi::now())?;
    match wait {
        Some(micros) if answer.outcome == Outcome::InProgress && wait::can_wait() => {
            wait::until_changed(request.scope, request.key, micros, |now| claim_at(&request, now))
        }
        _ => Ok(answer),
    }
}

/// One claim as of `now`: read (directly where that is safe, src/direct.rs), then write
/// through SPI only when the claim goes ahead.
fn claim_at(request: &Request<'_>, now: TimestampWithTimeZone) -> Result<Answer, IdemError> {
    let first =
        direct::read(Table::Keys, request.scope, request.key, READ.columns, |row| decide(request, now, row));
    if let Some(Next::Answer(answer)) = first {
        return Ok(answer);
    }
    Spi::connect_mut(|client| claim_with_spi(client, request, now, first))
}

/// What the record read (None: there is none) means for a claim as of `now`.
fn decide(request: &Request<'_>, now: TimestampWithTimeZone, row: Option<&impl Columns>) -> Next {
    let Some(row) = row else { return Next::NewClaim { expired: None } };
    let fingerprint = request.fingerprint;
    let stored = Stored::read(row);
    if stored.expires_at <= now {
        if stored.status == Status::Completed && tombstone_lasts(stored.expires_at, now) {
            if stored.fingerprint.as_deref() != fingerprint {
                return Next::Answer(Answer::mismatch(stored.expires_at));
            }
            let response_status: Option<i32> = get(row, &READ, "response_status");
            return Next::Answer(Answer {
                http_status: Some(410),
                response_status,
                attempts: Some(stored.attempts),
                expires_at: Some(stored.expires_at),
                ..Answer::empty(Outcome::Expired)
            });
        }
        return Next::NewClaim { expired: Some(stored.token) };
    }

    if stored.fingerprint.as_deref() != fingerprint {
        return Next::Answer(Answer::mismatch(stored.expires_at));
    }
    if stored.status == Status::Completed {
        let response_status: Option<i32> = get(row, &READ, "response_status");
        return Next::Answer(Answer {
            http_status: response_status,
            response_status,
            response_headers: get(row, &READ, "response_headers"),
            response_body: get(row, &READ, "response_body"),
            attempts: Some(stored.attempts),
            expires_at: Some(stored.expires_at),
            ..Answer::empty(Outcome::Replay)
        });
    }
    let locked_until = stored.locked_until.expect("in_progress has a lease");
    if request.token == Some(stored.token) && locked_until > now {
        // The caller's own claim, repeated (its first answer was lost): nothing to write.
        // Once its lease ended it is taken over, with the caller's token: reclaimed.
        return Next::Answer(Answer::claimed(
            Outcome::Claimed,
            stored.token,
            stored.attempts,
            locked_until,
            stored.expires_at,
            get(row, &READ, "recovery_point"),
            get(row, &READ, "recovery_data"),
        ));
    }
    if locked_until > now {
        return Next::Answer(Answer {
            http_status: Some(409),
            attempts: Some(stored.attempts),
            expires_at: Some(stored.expires_at),
            locked_until: Some(locked_until),
            ..Answer::empty(Outcome::InProgress)
        });
    }
    let expires_at = now + request.ttl;
    Next::TakeOver {
        read_token: stored.token,
        attempts: stored.attempts + 1,
        expires_at: if stored.expires_at > expires_at { stored.expires_at } else { expires_at },
    }
}

/// The claim's writes, and the reads through SPI after them (after a write they use fresh
/// snapshots, so a lost race reads what the other transaction left). `first`: what the
/// direct read decided, if it was taken.
fn claim_with_spi(
    client: &mut SpiClient<'_>,
    request: &Request<'_>,
    now: TimestampWithTimeZone,
    mut first: Option<Next>,
) -> Result<Answer, IdemError> {
    let (scope, key) = (request.scope, request.key);
    let expires_at = now + request.ttl;
    let lease_end = now + request.lease;
    let new_token = || request.token.unwrap_or_else(spi::new_token);
    for _ in 0..MAX_ROUNDS {
        let next = match first.take() {
            Some(next) => next,
            None => {
                let found = spi::run(client, &READ, &[scope.into(), key.into()]);
                let row = (!found.is_empty()).then(|| found.first());
                decide(request, now, row.as_ref())
            }
        };
        match next {
            Next::Answer(answer) => return Ok(answer),
            Next::NewClaim { expired } => {
                let token = new_token();
                let args = [
                    scope.into(),
                    key.into(),
                    request.fingerprint.into(),
                    token.into(),
                    lease_end.into(),
                    now.into(),
                    expires_at.into(),
                    expired.into(),
                ];
                let (stmt, args) =
                    if expired.is_some() { (&REPLACE_EXPIRED, &args[..]) } else { (&INSERT, &args[..7]) };
                spi::run(client, stmt, args);
                if spi::processed() == 1 {
                    return Ok(Answer::claimed(
                        Outcome::Claimed,
                        token,
                        1,
                        lease_end,
                        expires_at,
                        None,
                        None,
                    ));
                }
                // Another transaction changed the key first: read what it left.
            }
            Next::TakeOver { read_token, attempts, expires_at: new_expires } => {
                let token = new_token();
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
                        read_token.into(),
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
        }
    }
    Err(IdemError::ClaimContended { scope: scope.to_string(), key: key.to_string() })
}

/// Tombstones on, and the tombstone of a record that expired at `expired_at` still lasts.
fn tombstone_lasts(expired_at: TimestampWithTimeZone, now: TimestampWithTimeZone) -> bool {
    settings::tombstone_ttl().is_some_and(|ttl| expired_at + ttl > now)
}
