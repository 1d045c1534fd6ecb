//! idem_claim. One read of (scope, key) answers `replay`, `in_progress` and `mismatch`
//! with nothing written; only a claim that goes ahead writes: a new record, the replacement
//! of an expired record, or the takeover of a claim whose lease ended. A claim that would
//! create a record first takes the key's lock (src/keylock.rs) and reads again under a fresh
//! snapshot: a claim that waited there for another transaction's claim of the key now sees
//! what that transaction left. A takeover is fenced on the token it read.
//!
//! Second round: a caller-chosen `token` makes a repeated claim answer `claimed` again
//! (nothing written); with `idempotency.tombstone_ttl` on, an expired completed record
//! answers `expired` until its tombstone ends; a positive `wait` turns an `in_progress`
//! answer into a wait for the owner's record to change (src/api/wait.rs).
//!
//! Fourth round: with `deferred`, a claim of a free key writes nothing at all; the key stays
//! held by its lock and by this transaction's memory (src/api/deferred.rs) until
//! `idem_complete` writes the completed record, or COMMIT writes the `in_progress` one.

use pgrx::datum::{Interval, TimestampWithTimeZone, Uuid};
use pgrx::pg_sys::{self, INT4OID, TEXTOID, TIMESTAMPTZOID, UUIDOID};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

use crate::api::claim_result::Answer;
use crate::api::deferred::{self, Claim};
use crate::api::stored::{self, Record, READ};
use crate::api::wait;
use crate::api::write;
use crate::direct::{self, Table};
use crate::errors::{IdemError, OrRaise};
use crate::keylock::{self, Space};
use crate::record::{Outcome, Status};
use crate::spi::{self, get, Kind, Statement};
use crate::{policy, settings, validate};

/// Rounds of read-then-write before giving up with 40001. Each lost round means another
/// transaction changed this very key between our read and our write.
const MAX_ROUNDS: usize = 10;

// $1 scope, $2 key, $3 new token, $4 attempts, $5 locked_until, $6 now, $7 expires_at,
// $8 the token that was read: the takeover is fenced on it and on the lease having ended.
static TAKE_OVER: Statement = Statement {
    sql: concat!(
        "UPDATE idempotency.keys \
          SET token = $3, attempts = $4, locked_until = $5, updated_at = $6, expires_at = $7 \
          WHERE ",
        in_claims!(),
        " AND scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2 \
            AND token OPERATOR(pg_catalog.=) $8 \
            AND status OPERATOR(pg_catalog.=) 'in_progress' \
            AND locked_until OPERATOR(pg_catalog.<=) $6 \
            AND expires_at OPERATOR(pg_catalog.>) $6 \
          RETURNING recovery_point, recovery_data"
    ),
    args: &[TEXTOID, TEXTOID, UUIDOID, INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID, UUIDOID],
    kind: Kind::Write,
    columns: &["recovery_point", "recovery_data"],
};

// SQL's idem_claim (since 0.6.0, with deferred). Its C symbol is new
// (idem_claim_deferred_wrapper): the seven-argument idem_claim of 0.4.0 .. 0.5.0 calls
// idem_claim_wait_token_wrapper, and the five-argument one of older releases
// idem_claim_wrapper, which src/api/compat.rs keeps.
#[pg_extern(volatile, parallel_unsafe, name = "idem_claim")]
#[allow(clippy::too_many_arguments)]
fn idem_claim_deferred(
    fcinfo: pg_sys::FunctionCallInfo,
    scope: Option<&str>,
    key: Option<&str>,
    fingerprint: default!(Option<&str>, "NULL"),
    ttl: default!(Option<Interval>, "NULL"),
    lease: default!(Option<Interval>, "NULL"),
    wait: default!(Option<Interval>, "NULL"),
    token: default!(Option<Uuid>, "NULL"),
    deferred: default!(Option<bool>, false),
) -> pgrx::composite_type!('static, "idempotency.claim_result") {
    claim(scope, key, fingerprint, ttl, lease, wait, token, deferred).or_raise().into_tuple(fcinfo)
}

/// What a read of (scope, key) leads to.
enum Next {
    /// The answer, with nothing to write.
    Answer(Answer),
    /// The key is free: a new claim (replacing the expired record read, if there is one).
    NewClaim,
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
    /// A new claim is held without writing it (src/api/deferred.rs).
    deferred: bool,
}

/// idem_claim with its arguments as SQL passed them (also the compat symbols' body).
#[allow(clippy::too_many_arguments)]
pub(super) fn claim(
    scope: Option<&str>,
    key: Option<&str>,
    fingerprint: Option<&str>,
    ttl: Option<Interval>,
    lease: Option<Interval>,
    wait: Option<Interval>,
    token: Option<Uuid>,
    deferred: Option<bool>,
) -> Result<Answer, IdemError> {
    let request = Request {
        scope: validate::key_text("scope", scope)?,
        key: validate::key_text("key", key)?,
        fingerprint,
        ttl: validate::interval_arg("ttl", ttl, settings::default_ttl)?,
        lease: validate::interval_arg("lease", lease, settings::default_lease)?,
        token,
        // Where Citus runs, a call may run on the coordinator or on the worker of the scope's
        // shard: no one backend's lock or memory can hold the key, so the record is written.
        deferred: validate::required("deferred", deferred)? && !direct::citus_loaded(),
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

/// One claim as of `now`: this transaction's own deferred claim of the key if it holds one,
/// else the record read (directly where that is safe, src/direct.rs); then, only when the
/// claim goes ahead, the key lock and the write through SPI.
fn claim_at(request: &Request<'_>, now: TimestampWithTimeZone) -> Result<Answer, IdemError> {
    if let Some(held) = deferred::record(request.scope, request.key) {
        return Ok(match decide(request, now, Some(&held)) {
            Next::Answer(answer) => answer,
            // Its own claim, which nobody else can take: as a claim of another owner's.
            Next::NewClaim | Next::TakeOver { .. } => in_progress(&held),
        });
    }
    let first =
        direct::read(Table::Keys, request.scope, request.key, READ.columns, now, |row| row.map(Record::read));
    let first = first.map(|record| (decide(request, now, record.as_ref()), record.map(|r| r.token)));
    if let Some((Next::Answer(answer), _)) = first {
        return Ok(answer);
    }
    Spi::connect_mut(|client| claim_with_spi(client, request, now, first))
}

/// What the record read (None: there is none) means for a claim as of `now`.
fn decide(request: &Request<'_>, now: TimestampWithTimeZone, record: Option<&Record>) -> Next {
    let Some(stored) = record else { return Next::NewClaim };
    let fingerprint = request.fingerprint;
    if stored.expires_at <= now {
        if stored.status == Status::Completed && tombstone_lasts(stored.expires_at, now) {
            if stored.fingerprint.as_deref() != fingerprint {
                return Next::Answer(Answer::mismatch(stored.expires_at));
            }
            return Next::Answer(Answer {
                http_status: Some(410),
                response_status: stored.response_status,
                attempts: Some(stored.attempts),
                expires_at: Some(stored.expires_at),
                ..Answer::empty(Outcome::Expired)
            });
        }
        return Next::NewClaim;
    }

    if stored.fingerprint.as_deref() != fingerprint {
        return Next::Answer(Answer::mismatch(stored.expires_at));
    }
    if stored.status == Status::Completed {
        return Next::Answer(Answer {
            http_status: stored.response_status,
            response_status: stored.response_status,
            response_headers: stored.response_headers,
            response_body: stored.response_body,
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
            stored.recovery_point.clone(),
            stored.recovery_data,
        ));
    }
    if locked_until > now {
        return Next::Answer(in_progress(stored));
    }
    let expires_at = now + request.ttl;
    Next::TakeOver {
        read_token: stored.token,
        attempts: stored.attempts + 1,
        expires_at: if stored.expires_at > expires_at { stored.expires_at } else { expires_at },
    }
}

fn in_progress(stored: &Record) -> Answer {
    Answer {
        http_status: Some(409),
        attempts: Some(stored.attempts),
        expires_at: Some(stored.expires_at),
        locked_until: stored.locked_until,
        ..Answer::empty(Outcome::InProgress)
    }
}

/// The record of (scope, key) through SPI, with the statement's snapshot.
fn read_with_spi(client: &mut SpiClient<'_>, scope: &str, key: &str) -> Option<Record> {
    let found = spi::run(client, stored::read_statement(), &[scope.into(), key.into()]);
    (!found.is_empty()).then(|| Record::read(&found.first()))
}

/// The record of (scope, key) under the latest snapshot, which sees every commit so far:
/// what a claim reads once it holds the key lock.
fn read_latest(
    client: &mut SpiClient<'_>,
    scope: &str,
    key: &str,
    now: TimestampWithTimeZone,
) -> Option<Record> {
    // SAFETY: pushed and popped around the read; an error's abort unwinds the stack.
    unsafe { pg_sys::PushActiveSnapshot(pg_sys::GetLatestSnapshot()) };
    let record = direct::read(Table::Keys, scope, key, READ.columns, now, |row| row.map(Record::read))
        .unwrap_or_else(|| read_with_spi(client, scope, key));
    unsafe { pg_sys::PopActiveSnapshot() };
    record
}

/// REPEATABLE READ or SERIALIZABLE: the transaction's snapshot is kept for all its reads.
fn snapshot_is_kept() -> bool {
    // SAFETY: a plain read of the transaction's isolation level.
    unsafe { pg_sys::XactIsoLevel >= pg_sys::XACT_REPEATABLE_READ as i32 }
}

/// The claim's writes, and the reads through SPI around them. `first`: what the direct read
/// decided, with the token of the record it read, if it was taken.
fn claim_with_spi(
    client: &mut SpiClient<'_>,
    request: &Request<'_>,
    now: TimestampWithTimeZone,
    mut first: Option<(Next, Option<Uuid>)>,
) -> Result<Answer, IdemError> {
    let (scope, key) = (request.scope, request.key);
    let expires_at = now + request.ttl;
    let lease_end = now + request.lease;
    let new_token = || request.token.unwrap_or_else(spi::new_token);
    for _ in 0..MAX_ROUNDS {
        let (next, read_token) = match first.take() {
            Some(read) => read,
            None => {
                let record = read_with_spi(client, scope, key);
                (decide(request, now, record.as_ref()), record.map(|r| r.token))
            }
        };
        match next {
            Next::Answer(answer) => return Ok(answer),
            Next::NewClaim => {
                let token = new_token();
                let claim = Claim {
                    token,
                    fingerprint: request.fingerprint.map(str::to_string),
                    claimed_at: now,
                    expires_at,
                    locked_until: lease_end,
                    lease: request.lease,
                    replaces: read_token,
                    recovery_point: None,
                    recovery_data: None,
                };
                // Row-level security: the INSERT policy answers before any wait for the lock,
                // and before a deferred claim holds the key (src/policy.rs).
                let rls = policy::applies(c"keys");
                let mut trial =
                    || policy::trial(|| write::create(client, &claim.record(scope, key, None), None));
                if !keylock::try_lock(Space::Keys, scope, key) {
                    if rls {
                        trial();
                    }
                    keylock::lock(Space::Keys, scope, key);
                } else if rls && request.deferred {
                    trial();
                }
                let latest = read_latest(client, scope, key, now);
                if latest.as_ref().map(|r| r.token) != read_token {
                    if snapshot_is_kept() {
                        // The key changed after this transaction's snapshot, which cannot
                        // show what is there now.
                        return Err(IdemError::ConcurrentChange { deleted: latest.is_none() });
                    }
                    // Another transaction changed the key meanwhile: decide on what it left.
                    first = Some((decide(request, now, latest.as_ref()), latest.map(|r| r.token)));
                    continue;
                }
                if request.deferred {
                    // SAFETY: raises 25006 in a read-only transaction, as the INSERT would.
                    unsafe { pg_sys::PreventCommandIfReadOnly(c"idem_claim".as_ptr()) };
                    deferred::hold(scope, key, claim);
                } else {
                    write::create(client, &claim.record(scope, key, None), read_token);
                }
                return Ok(Answer::claimed(Outcome::Claimed, token, 1, lease_end, expires_at, None, None));
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
