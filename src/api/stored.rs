//! A record of idempotency.keys as the functions see it: read from the table (through SPI or
//! the direct read) or held by a deferred claim of this transaction (src/api/deferred.rs).
//! Below claim.rs, deferred.rs and lookup.rs, which all read records.

use pgrx::datum::{TimestampWithTimeZone, Uuid};
use pgrx::pg_sys::TEXTOID;

use crate::jsonb::Jsonb;
use crate::record::Status;
use crate::spi::{get, get_not_null, Columns, Kind, Statement};

/// The columns a claim decides on, in the order READ gives them.
macro_rules! record_columns {
    () => {
        "fingerprint, status, token, attempts, locked_until, expires_at, response_status, \
         response_headers, response_body, recovery_point, recovery_data"
    };
}

/// The record of (scope $1, key $2), every column a claim decides on. A key has at most one
/// record in the partitions a claim reads; one whose partition is about to be dropped may
/// still be there, expired: the latest expiry is the record.
pub(super) static READ: Statement = Statement {
    sql: concat!(
        "SELECT ",
        record_columns!(),
        " FROM idempotency.keys \
          WHERE scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2 \
          ORDER BY expires_at DESC LIMIT 1"
    ),
    args: &[TEXTOID, TEXTOID],
    kind: Kind::Read,
    columns: COLUMNS,
};

/// READ, while the table a 0.5.0 database kept its records in is there (they move into the
/// partitions as idem_sweep goes; sql/idempotency--0.5.0--0.6.0.sql).
pub(super) static READ_WITH_LEGACY: Statement = Statement {
    sql: concat!(
        "SELECT ",
        record_columns!(),
        " FROM (SELECT ",
        record_columns!(),
        " FROM idempotency.keys \
                 WHERE scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2 \
                UNION ALL SELECT ",
        record_columns!(),
        " FROM idempotency.keys_legacy \
                 WHERE scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2) AS r \
          ORDER BY expires_at DESC LIMIT 1"
    ),
    args: &[TEXTOID, TEXTOID],
    kind: Kind::Read,
    columns: COLUMNS,
};

const COLUMNS: &[&str] = &[
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
];

/// The statement that reads a record now: READ, or READ_WITH_LEGACY while there is a
/// legacy table.
pub(super) fn read_statement() -> &'static Statement {
    if crate::direct::legacy_exists(crate::direct::Table::Keys) {
        &READ_WITH_LEGACY
    } else {
        &READ
    }
}

/// One record, copied out of wherever it was read.
pub(super) struct Record {
    pub(super) fingerprint: Option<String>,
    pub(super) status: Status,
    pub(super) token: Uuid,
    pub(super) attempts: i32,
    pub(super) locked_until: Option<TimestampWithTimeZone>,
    pub(super) expires_at: TimestampWithTimeZone,
    pub(super) response_status: Option<i32>,
    pub(super) response_headers: Option<Jsonb>,
    pub(super) response_body: Option<Jsonb>,
    pub(super) recovery_point: Option<String>,
    pub(super) recovery_data: Option<Jsonb>,
}

impl Record {
    /// A row of READ's columns (from SPI or the direct read).
    pub(super) fn read(row: &impl Columns) -> Self {
        let status: String = get_not_null(row, &READ, "status");
        Record {
            fingerprint: get(row, &READ, "fingerprint"),
            // The functions write only the two statuses; any other (written by hand) is not completed.
            status: Status::parse(&status).unwrap_or(Status::InProgress),
            token: get_not_null(row, &READ, "token"),
            attempts: get_not_null(row, &READ, "attempts"),
            locked_until: get(row, &READ, "locked_until"),
            expires_at: get_not_null(row, &READ, "expires_at"),
            response_status: get(row, &READ, "response_status"),
            response_headers: get(row, &READ, "response_headers"),
            response_body: get(row, &READ, "response_body"),
            recovery_point: get(row, &READ, "recovery_point"),
            recovery_data: get(row, &READ, "recovery_data"),
        }
    }
}
