//! idem_complete, idem_checkpoint and idem_release: what the owner of a claim does with it.
//! Each is one statement fenced on the token; when it touches no row, a read says why.
//! Completing and releasing wake the claims waiting for the record once they commit.
//! A deferred claim this transaction holds (src/api/deferred.rs) is completed by writing its
//! record once, and checkpointed or released in memory.

use pgrx::datum::{Interval, TimestampWithTimeZone, Uuid};
use pgrx::pg_sys::{INT4OID, INTERVALOID, JSONBOID, TEXTOID, TIMESTAMPTZOID, UUIDOID};
use pgrx::prelude::*;

use crate::api::deferred::{self, Completion};
use crate::api::stored::{self, Record};
use crate::errors::{IdemError, OrRaise};
use crate::jsonb::Jsonb;
use crate::record::Status;
use crate::spi::{self, get_not_null, Kind, Statement};
use crate::{settings, validate, wakeup};

// Each statement touches the claim of (scope $1, key $2) only while token $3 owns it, it is
// still in_progress and it has not expired. Claims in flight live in their own partition
// (keys_claims, sql/bootstrap.sql), which in_claims!() keeps the statements to.

// $1 scope, $2 key, $3 token, $4 response_status, $5 response_headers, $6 response_body, $7 now.
// The claim leaves keys_claims and its completed record goes to the partition of its expiry:
// one delete and one insert (a takeover that waited on the claim finds it gone and reads again).
static COMPLETE: Statement = Statement {
    sql: concat!(
        "WITH claim AS (DELETE FROM idempotency.keys WHERE ",
        in_claims!(),
        " AND scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2 \
            AND token OPERATOR(pg_catalog.=) $3 AND status OPERATOR(pg_catalog.=) 'in_progress' \
            AND expires_at OPERATOR(pg_catalog.>) $7 \
          RETURNING scope, key, fingerprint, token, attempts, recovery_point, recovery_data, \
                    created_at, expires_at) \
         INSERT INTO idempotency.keys \
              (scope, key, fingerprint, status, token, attempts, locked_until, recovery_point, \
               recovery_data, response_status, response_headers, response_body, created_at, \
               updated_at, completed_at, expires_at) \
         SELECT scope, key, fingerprint, 'completed', token, attempts, NULL, recovery_point, \
                recovery_data, $4, $5, $6, created_at, $7, $7, expires_at FROM claim"
    ),
    args: &[TEXTOID, TEXTOID, UUIDOID, INT4OID, JSONBOID, JSONBOID, TIMESTAMPTZOID],
    kind: Kind::Write,
    columns: &[],
};

// $1 scope, $2 key, $3 token, $4 recovery_point, $5 recovery_data, $6 the lease given or
// NULL, $7 now, $8 default_lease. Without a lease the claim keeps the length of the lease it
// was made with: every write of locked_until sets updated_at to the same now, so the
// difference is that length (default_lease where there is none to read).
static CHECKPOINT: Statement = Statement {
    sql: concat!(
        "UPDATE idempotency.keys \
          SET recovery_point = $4, recovery_data = $5, updated_at = $7, \
              locked_until = $7 OPERATOR(pg_catalog.+) COALESCE($6, \
                  CASE WHEN locked_until OPERATOR(pg_catalog.>) updated_at \
                       THEN locked_until OPERATOR(pg_catalog.-) updated_at END, $8) \
          WHERE ",
        in_claims!(),
        " AND scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2 \
            AND token OPERATOR(pg_catalog.=) $3 AND status OPERATOR(pg_catalog.=) 'in_progress' \
            AND expires_at OPERATOR(pg_catalog.>) $7 \
          RETURNING locked_until"
    ),
    args: &[TEXTOID, TEXTOID, UUIDOID, TEXTOID, JSONBOID, INTERVALOID, TIMESTAMPTZOID, INTERVALOID],
    kind: Kind::Write,
    columns: &["locked_until"],
};

// $1 scope, $2 key, $3 token, $4 now
static RELEASE: Statement = Statement {
    sql: concat!(
        "DELETE FROM idempotency.keys WHERE ",
        in_claims!(),
        " AND scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2 \
            AND token OPERATOR(pg_catalog.=) $3 AND status OPERATOR(pg_catalog.=) 'in_progress' \
            AND expires_at OPERATOR(pg_catalog.>) $4"
    ),
    args: &[TEXTOID, TEXTOID, UUIDOID, TIMESTAMPTZOID],
    kind: Kind::Write,
    columns: &[],
};

#[pg_extern(volatile, parallel_unsafe)]
fn idem_complete(
    scope: Option<&str>,
    key: Option<&str>,
    token: Option<Uuid>,
    response_status: Option<i32>,
    response_body: default!(Option<Jsonb>, "NULL"),
    response_headers: default!(Option<Jsonb>, "NULL"),
) {
    complete(scope, key, token, response_status, response_body, response_headers).or_raise()
}

#[pg_extern(volatile, parallel_unsafe)]
fn idem_checkpoint(
    scope: Option<&str>,
    key: Option<&str>,
    token: Option<Uuid>,
    recovery_point: Option<&str>,
    recovery_data: default!(Option<Jsonb>, "NULL"),
    lease: default!(Option<Interval>, "NULL"),
) -> TimestampWithTimeZone {
    checkpoint(scope, key, token, recovery_point, recovery_data, lease).or_raise()
}

#[pg_extern(volatile, parallel_unsafe)]
fn idem_release(scope: Option<&str>, key: Option<&str>, token: Option<Uuid>) -> bool {
    release(scope, key, token).or_raise()
}

fn complete(
    scope: Option<&str>,
    key: Option<&str>,
    token: Option<Uuid>,
    response_status: Option<i32>,
    response_body: Option<Jsonb>,
    response_headers: Option<Jsonb>,
) -> Result<(), IdemError> {
    let scope = validate::key_text("scope", scope)?;
    let key = validate::key_text("key", key)?;
    let token = validate::required("token", token)?;
    let status = validate::response_status(response_status)?;
    if let Some(headers) = response_headers {
        validate::headers_kind(headers.kind())?;
    }
    let size = response_body.map_or(0, |b| b.raw_size()) + response_headers.map_or(0, |h| h.raw_size());
    validate::stored_size("response_body", size, settings::max_response_bytes())?;
    spi::require_primary("idem_complete")?;
    let now = spi::now();
    let done = Completion { status, headers: response_headers, body: response_body, at: now };
    if let Some(result) = deferred::complete(scope, key, token, done) {
        return result;
    }
    Spi::connect_mut(|client| {
        spi::run(
            client,
            &COMPLETE,
            &[
                scope.into(),
                key.into(),
                token.into(),
                status.into(),
                response_headers.into(),
                response_body.into(),
                now.into(),
            ],
        );
        if spi::processed() == 1 {
            wakeup::notify_on_commit(scope, key);
            return Ok(());
        }
        Err(why_not_owned(client, scope, key, token, now))
    })
}

fn checkpoint(
    scope: Option<&str>,
    key: Option<&str>,
    token: Option<Uuid>,
    recovery_point: Option<&str>,
    recovery_data: Option<Jsonb>,
    lease: Option<Interval>,
) -> Result<TimestampWithTimeZone, IdemError> {
    let scope = validate::key_text("scope", scope)?;
    let key = validate::key_text("key", key)?;
    let token = validate::required("token", token)?;
    let recovery_point = validate::required("recovery_point", recovery_point)?;
    let size = recovery_data.map_or(0, |d| d.raw_size()) + recovery_point.len();
    validate::stored_size("recovery_data", size, settings::max_response_bytes())?;
    let lease =
        lease.map(|l| validate::interval_arg("lease", Some(l), settings::default_lease)).transpose()?;
    spi::require_primary("idem_checkpoint")?;
    let now = spi::now();
    if let Some(result) = deferred::checkpoint(scope, key, token, recovery_point, recovery_data, lease, now) {
        return result;
    }
    Spi::connect_mut(|client| {
        let renewed = spi::run(
            client,
            &CHECKPOINT,
            &[
                scope.into(),
                key.into(),
                token.into(),
                recovery_point.into(),
                recovery_data.into(),
                lease.into(),
                now.into(),
                settings::default_lease().into(),
            ],
        );
        if !renewed.is_empty() {
            return Ok(get_not_null(&renewed.first(), &CHECKPOINT, "locked_until"));
        }
        Err(why_not_owned(client, scope, key, token, now))
    })
}

fn release(scope: Option<&str>, key: Option<&str>, token: Option<Uuid>) -> Result<bool, IdemError> {
    let scope = validate::key_text("scope", scope)?;
    let key = validate::key_text("key", key)?;
    let token = validate::required("token", token)?;
    spi::require_primary("idem_release")?;
    let now = spi::now();
    if let Some(released) = deferred::release(scope, key, token) {
        return Ok(released);
    }
    Spi::connect_mut(|client| {
        spi::run(client, &RELEASE, &[scope.into(), key.into(), token.into(), now.into()]);
        let released = spi::processed() == 1;
        if released {
            wakeup::notify_on_commit(scope, key);
        }
        Ok(released)
    })
}

fn why_not_owned(
    client: &mut pgrx::spi::SpiClient<'_>,
    scope: &str,
    key: &str,
    token: Uuid,
    now: TimestampWithTimeZone,
) -> IdemError {
    let (scope_s, key_s) = (scope.to_string(), key.to_string());
    // Runs after a write, so with a fresh snapshot.
    let found = spi::run(client, stored::read_statement(), &[scope.into(), key.into()]);
    if found.is_empty() {
        return IdemError::NoLiveRecord { scope: scope_s, key: key_s };
    }
    let record = Record::read(&found.first());
    if record.expires_at <= now {
        IdemError::NoLiveRecord { scope: scope_s, key: key_s }
    } else if record.token != token {
        IdemError::NotOwner { scope: scope_s, key: key_s }
    } else if record.status == Status::Completed {
        IdemError::AlreadyCompleted { scope: scope_s, key: key_s }
    } else {
        IdemError::NotOwner { scope: scope_s, key: key_s }
    }
}
