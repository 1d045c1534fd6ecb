//! Creating a record of idempotency.keys: a claim's `in_progress` record (idem_claim, or a
//! deferred claim at COMMIT), or a deferred claim's `completed` record (idem_complete). The
//! caller holds the key lock (src/keylock.rs) and has read the key under a fresh snapshot, so
//! it knows whether an expired record is there to be replaced, and by which token.

use pgrx::datum::{TimestampWithTimeZone, Uuid};
use pgrx::pg_sys::{INT4OID, JSONBOID, TEXTOID, TIMESTAMPTZOID, UUIDOID};
use pgrx::spi::SpiClient;

use crate::jsonb::Jsonb;
use crate::record::Status;
use crate::spi::{self, Kind, Statement};

// The columns, in the order of INSERT's parameters $1 .. $16.
const ARGS: &[pgrx::pg_sys::Oid] = &[
    TEXTOID,        // $1 scope
    TEXTOID,        // $2 key
    TEXTOID,        // $3 fingerprint
    TEXTOID,        // $4 status
    UUIDOID,        // $5 token
    INT4OID,        // $6 attempts
    TIMESTAMPTZOID, // $7 locked_until
    TEXTOID,        // $8 recovery_point
    JSONBOID,       // $9 recovery_data
    INT4OID,        // $10 response_status
    JSONBOID,       // $11 response_headers
    JSONBOID,       // $12 response_body
    TIMESTAMPTZOID, // $13 created_at
    TIMESTAMPTZOID, // $14 updated_at
    TIMESTAMPTZOID, // $15 completed_at
    TIMESTAMPTZOID, // $16 expires_at
];

// The caller holds the key lock and found no live record, so no other row of the key can be
// in the partition this one goes to: a row that a session without the key lock wrote (an
// older release's library, a hand-made INSERT) fails it with 23505.
static INSERT: Statement = Statement {
    sql: "INSERT INTO idempotency.keys \
              (scope, key, fingerprint, status, token, attempts, locked_until, recovery_point, \
               recovery_data, response_status, response_headers, response_body, created_at, \
               updated_at, completed_at, expires_at) \
          VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)",
    args: ARGS,
    kind: Kind::Write,
    columns: &[],
};

// The expired record of (scope $1, key $2) that carried token $3, if it is still there and
// expired by $4: gone before the new one is written (in whatever partition either lives).
const DELETE_ARGS: &[pgrx::pg_sys::Oid] = &[TEXTOID, TEXTOID, UUIDOID, TIMESTAMPTZOID];
static DELETE_EXPIRED: Statement = Statement {
    sql: "DELETE FROM idempotency.keys \
          WHERE scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2 \
            AND token OPERATOR(pg_catalog.=) $3 AND expires_at OPERATOR(pg_catalog.<=) $4",
    args: DELETE_ARGS,
    kind: Kind::Write,
    columns: &[],
};

// ... or in the table a 0.5.0 database kept its records in, while it is there.
static DELETE_EXPIRED_LEGACY: Statement = Statement {
    sql: "DELETE FROM idempotency.keys_legacy \
          WHERE scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2 \
            AND token OPERATOR(pg_catalog.=) $3 AND expires_at OPERATOR(pg_catalog.<=) $4",
    args: DELETE_ARGS,
    kind: Kind::Write,
    columns: &[],
};

// Where Citus is loaded, a claim in a transaction block runs on the coordinator and takes the
// key lock there, while an autocommit claim is delegated to the worker holding the scope's
// shard and takes it there: the two can meet at the primary key. The loser does nothing (after
// the winner's transaction ended) and reads the key again, as before 0.6.0.
static INSERT_OR_NOTHING: Statement = Statement {
    sql: "INSERT INTO idempotency.keys \
              (scope, key, fingerprint, status, token, attempts, locked_until, recovery_point, \
               recovery_data, response_status, response_headers, response_body, created_at, \
               updated_at, completed_at, expires_at) \
          VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16) \
          ON CONFLICT DO NOTHING",
    args: ARGS,
    kind: Kind::Write,
    columns: &[],
};

/// A record to create.
pub(super) struct NewRecord<'a> {
    pub(super) scope: &'a str,
    pub(super) key: &'a str,
    pub(super) fingerprint: Option<&'a str>,
    pub(super) status: Status,
    pub(super) token: Uuid,
    pub(super) attempts: i32,
    pub(super) locked_until: Option<TimestampWithTimeZone>,
    pub(super) recovery_point: Option<&'a str>,
    pub(super) recovery_data: Option<Jsonb>,
    pub(super) response_status: Option<i32>,
    pub(super) response_headers: Option<Jsonb>,
    pub(super) response_body: Option<Jsonb>,
    /// now(): the claim's time (an expired record is replaced only if it expired by then).
    pub(super) created_at: TimestampWithTimeZone,
    pub(super) updated_at: TimestampWithTimeZone,
    pub(super) completed_at: Option<TimestampWithTimeZone>,
    pub(super) expires_at: TimestampWithTimeZone,
}

/// Writes `record`, first deleting the expired record of token `replaces` if the caller read
/// one. False where Citus is loaded and a claim that ran on another node wrote the key first
/// (then the caller reads it again).
pub(super) fn create(client: &mut SpiClient<'_>, record: &NewRecord<'_>, replaces: Option<Uuid>) -> bool {
    if let Some(expired) = replaces {
        let args = [record.scope.into(), record.key.into(), expired.into(), record.created_at.into()];
        spi::run(client, &DELETE_EXPIRED, &args);
        if spi::processed() == 0 && crate::direct::legacy_exists(crate::direct::Table::Keys) {
            spi::run(client, &DELETE_EXPIRED_LEGACY, &args);
        }
    }
    let args = [
        record.scope.into(),
        record.key.into(),
        record.fingerprint.into(),
        record.status.as_str().into(),
        record.token.into(),
        record.attempts.into(),
        record.locked_until.into(),
        record.recovery_point.into(),
        record.recovery_data.into(),
        record.response_status.into(),
        record.response_headers.into(),
        record.response_body.into(),
        record.created_at.into(),
        record.updated_at.into(),
        record.completed_at.into(),
        record.expires_at.into(),
    ];
    if crate::direct::citus_loaded() {
        spi::run(client, &INSERT_OR_NOTHING, &args);
        spi::processed() == 1
    } else {
        spi::run(client, &INSERT, &args);
        true
    }
}
