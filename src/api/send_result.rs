//! idem_send_result (docs/sending.md): records what an attempt got, fenced by its token. The
//! portable edition's is sql/send.sql's send_finish, with the same answers and errors: a final
//! answer makes the send `done` with the response stored; a retryable one (no answer, 408,
//! 409, 425, 429, 500, 502, 503, 504) makes it `pending` again after a backoff with full jitter,
//! never sooner than Retry-After, or `gave_up` when that lies past give_up_at.
//!
//! One statement changes the row if the token still holds it; only when it does not is the row
//! read again, to say why (IK001, IK002, IK003).

use std::sync::LazyLock;

use pgrx::datum::{Interval, TimestampWithTimeZone, Uuid};
use pgrx::pg_sys::{INT4OID, INTERVALOID, JSONBOID, TEXTOID, UUIDOID};
use pgrx::prelude::*;
use pgrx::spi::SpiClient;

use super::send_budget;
use crate::budget_ledger::Counts;
use crate::errors::{IdemError, OrRaise};
use crate::jsonb::Jsonb;
use crate::spi::{self, get, get_not_null, Kind, Statement};
use crate::{sending, settings, validate};

/// The row (scope $1, operation $2) while token $3 holds it.
const HELD: &str = "o.scope OPERATOR(pg_catalog.=) $1 AND o.operation OPERATOR(pg_catalog.=) $2 \
                    AND o.state OPERATOR(pg_catalog.=) 'sending' AND o.token OPERATOR(pg_catalog.=) $3";

const RESULT_COLUMNS: &[&str] = &["state", "attempts", "next_attempt_at", "target"];

/// A final answer ($4 the status, $5 and $6 the response, $7 idempotency.default_ttl).
static FINAL: LazyLock<Statement> = LazyLock::new(|| Statement {
    sql: format!(
        "UPDATE idempotency.outbound AS o \
            SET state = 'done', locked_until = NULL, last_status = $4, last_error = NULL, \
                response_status = $4, response_body = $5, response_headers = $6, \
                finished_at = pg_catalog.now(), expires_at = pg_catalog.now() OPERATOR(pg_catalog.+) $7 \
          WHERE {HELD} \
         RETURNING o.state, o.attempts, o.next_attempt_at, o.target"
    )
    .leak(),
    args: &[TEXTOID, TEXTOID, UUIDOID, INT4OID, TEXTOID, JSONBOID, INTERVALOID],
    kind: Kind::Fresh,
    columns: RESULT_COLUMNS,
});

/// A retryable answer ($4 the status or NULL, $5 the error, $6 Retry-After, $7 and $8
/// idempotency.send_backoff_base and _cap, $9 idempotency.default_ttl): pending again at
/// now() + the delay, or gave_up when that is not before give_up_at. One random() per call.
static RETRYABLE: LazyLock<Statement> = LazyLock::new(|| {
    let delay = "GREATEST(COALESCE($6, '0'::pg_catalog.interval), \
                 j.r OPERATOR(pg_catalog.*) LEAST($8, $7 OPERATOR(pg_catalog.*) \
                 pg_catalog.power(2, LEAST(o.attempts OPERATOR(pg_catalog.-) 1, 60))))";
    let gave_up =
        format!("(pg_catalog.now() OPERATOR(pg_catalog.+) {delay}) OPERATOR(pg_catalog.>=) o.give_up_at");
    Statement {
        sql: format!(
            "UPDATE idempotency.outbound AS o \
                SET state = CASE WHEN {gave_up} THEN 'gave_up' ELSE 'pending' END, \
                    token = NULL, locked_until = NULL, last_status = $4, last_error = $5, \
                    next_attempt_at = CASE WHEN {gave_up} THEN o.next_attempt_at \
                                           ELSE pg_catalog.now() OPERATOR(pg_catalog.+) {delay} END, \
                    finished_at = CASE WHEN {gave_up} THEN pg_catalog.now() ELSE o.finished_at END, \
                    expires_at = CASE WHEN {gave_up} THEN pg_catalog.now() OPERATOR(pg_catalog.+) $9 \
                                      ELSE o.expires_at END \
               FROM (SELECT pg_catalog.random() AS r) AS j \
              WHERE {HELD} \
             RETURNING o.state, o.attempts, o.next_attempt_at, o.target"
        )
        .leak(),
        args: &[
            TEXTOID,
            TEXTOID,
            UUIDOID,
            INT4OID,
            TEXTOID,
            INTERVALOID,
            INTERVALOID,
            INTERVALOID,
            INTERVALOID,
        ],
        kind: Kind::Fresh,
        columns: RESULT_COLUMNS,
    }
});

/// Why the token does not hold the row: it is not there, or what it is now.
static WHY_NOT: Statement = Statement {
    sql: "SELECT o.state, o.token FROM idempotency.outbound AS o \
          WHERE o.scope OPERATOR(pg_catalog.=) $1 AND o.operation OPERATOR(pg_catalog.=) $2",
    args: &[TEXTOID, TEXTOID],
    kind: Kind::Fresh,
    columns: &["state", "token"],
};

#[allow(clippy::too_many_arguments)]
#[pg_extern(volatile, parallel_unsafe)]
fn idem_send_result(
    scope: Option<&str>,
    operation: Option<&str>,
    token: Option<Uuid>,
    http_status: default!(Option<i32>, "NULL"),
    response_body: default!(Option<&str>, "NULL"),
    response_headers: default!(Option<Jsonb>, "NULL"),
    retry_after: default!(Option<Interval>, "NULL"),
    error: default!(Option<&str>, "NULL"),
) -> TableIterator<
    'static,
    (name!(state, String), name!(attempts, i32), name!(next_attempt_at, TimestampWithTimeZone)),
> {
    let answer = Answer { http_status, response_body, response_headers, retry_after, error };
    let (state, attempts, next_attempt_at) = send_result(scope, operation, token, answer).or_raise();
    TableIterator::once((state, attempts, next_attempt_at))
}

/// What the attempt got.
struct Answer<'a> {
    http_status: Option<i32>,
    response_body: Option<&'a str>,
    response_headers: Option<Jsonb>,
    retry_after: Option<Interval>,
    error: Option<&'a str>,
}

fn send_result(
    scope: Option<&str>,
    operation: Option<&str>,
    token: Option<Uuid>,
    answer: Answer<'_>,
) -> Result<(String, i32, TimestampWithTimeZone), IdemError> {
    // In sql/send.sql's order, so that a call with several bad arguments names the same one.
    let scope = validate::key_text("scope", scope)?;
    let operation = validate::key_text("operation", operation)?;
    let token = validate::required("token", token)?;
    sending::http_status(answer.http_status)?;
    if let Some(headers) = &answer.response_headers {
        let kind = headers.type_name();
        if kind != "object" {
            return Err(IdemError::invalid(
                "response_headers",
                format!("must be a JSON object (got {kind})"),
            ));
        }
    }
    if let Some(r) = answer.retry_after {
        sending::retry_after(r.months(), r.days(), r.micros(), || r.to_string())?;
    }
    let retryable = sending::retryable(answer.http_status);
    Spi::connect_mut(|client| {
        send_budget::write_past(client);
        let ttl = settings::default_ttl();
        let (stmt, changed) = if retryable {
            let args = [
                scope.into(),
                operation.into(),
                token.into(),
                answer.http_status.into(),
                answer.error.into(),
                answer.retry_after.into(),
                settings::send_backoff_base().into(),
                settings::send_backoff_cap().into(),
                ttl.into(),
            ];
            (&*RETRYABLE, spi::run(client, &RETRYABLE, &args))
        } else {
            let args = [
                scope.into(),
                operation.into(),
                token.into(),
                answer.http_status.into(),
                answer.response_body.into(),
                answer.response_headers.into(),
                ttl.into(),
            ];
            (&*FINAL, spi::run(client, &FINAL, &args))
        };
        if changed.is_empty() {
            return Err(why_not(client, scope, operation, token));
        }
        let row = changed.first();
        let target: String = get_not_null(&row, stmt, "target");
        let result = (
            get_not_null(&row, stmt, "state"),
            get_not_null(&row, stmt, "attempts"),
            get_not_null(&row, stmt, "next_attempt_at"),
        );
        if retryable {
            // A retryable answer stops what final answers had earned: counted at once.
            send_budget::count(&target, Counts { retryable_answers: 1, ..Counts::default() });
            send_budget::write_target(client, &target);
        } else {
            send_budget::count(&target, Counts { final_answers: 1, ..Counts::default() });
        }
        Ok(result)
    })
}

fn why_not(client: &mut SpiClient<'_>, scope: &str, operation: &str, token: Uuid) -> IdemError {
    let (scope_, operation_) = (scope.to_string(), operation.to_string());
    let found = spi::run(client, &WHY_NOT, &[scope.into(), operation.into()]);
    if found.is_empty() {
        return IdemError::NoOutbound { scope: scope_, operation: operation_ };
    }
    let row = found.first();
    let state: String = get_not_null(&row, &WHY_NOT, "state");
    if state == "done" && get::<Uuid>(&row, &WHY_NOT, "token") == Some(token) {
        return IdemError::SendAlreadyDone { scope: scope_, operation: operation_ };
    }
    IdemError::SendNotHeld { scope: scope_, operation: operation_ }
}
