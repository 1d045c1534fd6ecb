//! The typed client: one function per SQL function of the extension's contract.
//!
//! Every statement goes through `query_typed` (an unnamed statement, parsed, bound and run in
//! one round trip): nothing is prepared by name, so the client works behind PgBouncer in
//! transaction-pooling mode, where a named prepared statement does not survive the transaction.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{GenericClient, Row};
use uuid::Uuid;

use crate::error::Error;

/// What `idem_claim` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// No live record existed: the caller owns a new `in_progress` record.
    Claimed,
    /// An `in_progress` record whose lease had ended was taken over.
    Reclaimed,
    /// The record is completed: send the stored response.
    Replay,
    /// Another owner's lease is still running (HTTP 409).
    InProgress,
    /// The key was used with another fingerprint (HTTP 422).
    Mismatch,
    /// A tombstone of an expired completed record (HTTP 410; tombstones on).
    Expired,
}

impl Outcome {
    pub fn parse(word: &str) -> Option<Outcome> {
        Some(match word {
            "claimed" => Outcome::Claimed,
            "reclaimed" => Outcome::Reclaimed,
            "replay" => Outcome::Replay,
            "in_progress" => Outcome::InProgress,
            "mismatch" => Outcome::Mismatch,
            "expired" => Outcome::Expired,
            _ => return None,
        })
    }

    /// True when the caller now owns the key and must run the operation.
    pub fn owns(self) -> bool {
        matches!(self, Outcome::Claimed | Outcome::Reclaimed)
    }
}

/// One `idem_claim` result (`claim_result`), typed.
#[derive(Debug, Clone)]
pub struct Claim {
    pub outcome: Outcome,
    pub token: Option<Uuid>,
    pub http_status: Option<u16>,
    pub response_status: Option<u16>,
    pub response_headers: Option<Value>,
    pub response_body: Option<Value>,
    /// The stored body as PostgreSQL prints the jsonb: what a replay sends, byte for byte.
    pub response_body_text: Option<String>,
    pub recovery_point: Option<String>,
    pub recovery_data: Option<Value>,
    pub attempts: Option<i32>,
    pub expires_at: Option<SystemTime>,
    /// Time left on the owner's lease (in_progress, claimed, reclaimed), from the server's clock.
    pub lease_left: Option<Duration>,
}

/// The arguments of `idem_claim`. `wait`, `token` and `deferred` are sent only when the
/// extension has them (see [`Features`]).
#[derive(Debug, Clone, Default)]
pub struct ClaimArgs<'a> {
    pub scope: &'a str,
    pub key: &'a str,
    pub fingerprint: Fingerprint<'a>,
    pub ttl: Option<Duration>,
    pub lease: Option<Duration>,
    pub wait: Option<Duration>,
    pub token: Option<Uuid>,
    /// A claim made in the transaction that also runs the work and its `idem_complete`
    /// (extension 0.6.0): it writes nothing until `idem_complete` writes the completed record
    /// (a COMMIT without one writes the `in_progress` record, as without `deferred`). Never for
    /// a claim that commits on its own (committed first).
    pub deferred: bool,
}

/// The request's fingerprint: given, or computed by `idem_fingerprint` in the claim's statement.
#[derive(Debug, Clone, Copy, Default)]
pub enum Fingerprint<'a> {
    /// No fingerprint: any request with the key matches.
    #[default]
    None,
    /// A fingerprint computed by the caller (`sha256:<hex>` by convention).
    Given(&'a str),
    /// RFC 8785 of this JSON, without these top-level keys (`idem_fingerprint(jsonb, ignore)`).
    Json(&'a Value, &'a [String]),
    /// SHA-256 of these bytes (`idem_fingerprint(bytea)`), for bodies that are not JSON.
    Bytes(&'a [u8]),
}

/// What the installed extension offers beyond the first round of the contract.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Features {
    /// `idem_claim(..., wait, token)`.
    pub claim_wait_and_token: bool,
    /// `idem_seen_many`.
    pub seen_many: bool,
    /// `idem_claim(..., deferred)` (0.6.0).
    pub claim_deferred: bool,
}

/// Looks the optional arguments up in the catalog (once per pool is enough).
pub async fn features(db: &impl GenericClient) -> Result<Features, Error> {
    let row = db
        .query_typed_one(
            "SELECT coalesce(bool_or(p.proname = 'idem_claim' AND 'token' = ANY(p.proargnames)
                                   AND 'wait' = ANY(p.proargnames)), false),
                    coalesce(bool_or(p.proname = 'idem_seen_many'), false),
                    coalesce(bool_or(p.proname = 'idem_claim' AND 'deferred' = ANY(p.proargnames)), false)
             FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = 'idempotency'",
            &[],
        )
        .await?;
    Ok(Features { claim_wait_and_token: row.get(0), seen_many: row.get(1), claim_deferred: row.get(2) })
}

/// An interval parameter, sent as text (`'1500 milliseconds'`) and cast by the server.
pub(crate) fn interval(d: Option<Duration>) -> Option<String> {
    d.map(|d| format!("{} milliseconds", d.as_millis()))
}

const CLAIM_COLUMNS: &str = "c.outcome, c.token, c.http_status, c.response_status, c.response_headers,
       c.response_body, c.response_body::text, c.recovery_point, c.recovery_data, c.attempts,
       extract(epoch FROM c.expires_at)::float8,
       extract(epoch FROM c.locked_until - clock_timestamp())::float8";

/// `idem_claim`. With `features.claim_wait_and_token`, `args.wait` and `args.token` are passed;
/// otherwise they are ignored (the claim answers at once and makes its own token). With
/// `features.claim_deferred`, `args.deferred` is passed; otherwise the claim writes its record at
/// once (what a deferred claim amounts to where it is not offered).
pub async fn claim(
    db: &impl GenericClient,
    features: Features,
    args: &ClaimArgs<'_>,
) -> Result<Claim, Error> {
    let (ttl, lease, wait) = (interval(args.ttl), interval(args.lease), interval(args.wait));
    let (given, json, ignore, bytes) = match args.fingerprint {
        Fingerprint::None => (None, None, None, None),
        Fingerprint::Given(f) => (Some(f), None, None, None),
        Fingerprint::Json(v, ignore) => (None, Some(v), Some(ignore), None),
        Fingerprint::Bytes(b) => (None, None, None, Some(b)),
    };
    let mut params: Vec<(&(dyn ToSql + Sync), Type)> = vec![
        (&args.scope, Type::TEXT),
        (&args.key, Type::TEXT),
        (&given, Type::TEXT),
        (&json, Type::JSONB),
        (&ignore, Type::TEXT_ARRAY),
        (&bytes, Type::BYTEA),
        (&ttl, Type::TEXT),
        (&lease, Type::TEXT),
    ];
    if features.claim_wait_and_token {
        params.push((&wait, Type::TEXT));
        params.push((&args.token, Type::UUID));
    }
    let row = db.query_typed_one(&claim_sql(features, args.deferred), &params).await?;
    claim_from_row(&row)
}

/// The statement of [`claim`]: `$1`..`$8`, then `$9` (wait) and `$10` (token) with
/// `claim_wait_and_token`, and `deferred => true` where asked for and offered.
fn claim_sql(features: Features, deferred: bool) -> String {
    let mut extra = String::new();
    if features.claim_wait_and_token {
        extra.push_str(", wait => $9::interval, token => $10");
    }
    if features.claim_deferred && deferred {
        extra.push_str(", deferred => true");
    }
    format!(
        "SELECT {CLAIM_COLUMNS}
         FROM idempotency.idem_claim($1, $2,
                CASE WHEN $4 IS NOT NULL THEN idempotency.idem_fingerprint($4, $5)
                     WHEN $6 IS NOT NULL THEN idempotency.idem_fingerprint($6)
                     ELSE $3 END,
                $7::interval, $8::interval{extra}) AS c"
    )
}

fn claim_from_row(row: &Row) -> Result<Claim, Error> {
    let word: String = row.get(0);
    let outcome = Outcome::parse(&word).ok_or(Error::UnknownOutcome(word))?;
    let status = |i: usize| row.get::<_, Option<i32>>(i).map(|s| s as u16);
    Ok(Claim {
        outcome,
        token: row.get(1),
        http_status: status(2),
        response_status: status(3),
        response_headers: row.get(4),
        response_body: row.get(5),
        response_body_text: row.get(6),
        recovery_point: row.get(7),
        recovery_data: row.get(8),
        attempts: row.get(9),
        expires_at: row
            .get::<_, Option<f64>>(10)
            .and_then(|s| UNIX_EPOCH.checked_add(Duration::from_secs_f64(s.max(0.0)))),
        lease_left: row.get::<_, Option<f64>>(11).map(|s| Duration::from_secs_f64(s.max(0.0))),
    })
}

/// `idem_complete`. Returns the stored body as PostgreSQL prints it (the bytes a replay sends).
pub async fn complete(
    db: &impl GenericClient,
    scope: &str,
    key: &str,
    token: Uuid,
    status: u16,
    body: Option<&Value>,
    headers: Option<&Value>,
) -> Result<Option<String>, Error> {
    let status = i32::from(status);
    let row = db
        .query_typed_one(
            "SELECT $5::jsonb::text FROM idempotency.idem_complete($1, $2, $3, $4, $5, $6)",
            &[
                (&scope, Type::TEXT),
                (&key, Type::TEXT),
                (&token, Type::UUID),
                (&status, Type::INT4),
                (&body, Type::JSONB),
                (&headers, Type::JSONB),
            ],
        )
        .await?;
    Ok(row.get(0))
}

/// `idem_checkpoint`: records progress and renews the lease; returns the lease left.
pub async fn checkpoint(
    db: &impl GenericClient,
    scope: &str,
    key: &str,
    token: Uuid,
    recovery_point: &str,
    recovery_data: Option<&Value>,
    lease: Option<Duration>,
) -> Result<Duration, Error> {
    let lease = interval(lease);
    let row = db
        .query_typed_one(
            "SELECT extract(epoch FROM idempotency.idem_checkpoint($1, $2, $3, $4, $5, $6::interval)
                                      - clock_timestamp())::float8",
            &[
                (&scope, Type::TEXT),
                (&key, Type::TEXT),
                (&token, Type::UUID),
                (&recovery_point, Type::TEXT),
                (&recovery_data, Type::JSONB),
                (&lease, Type::TEXT),
            ],
        )
        .await?;
    Ok(Duration::from_secs_f64(row.get::<_, f64>(0).max(0.0)))
}

/// `idem_release`: false when the token no longer owns a live record.
pub async fn release(db: &impl GenericClient, scope: &str, key: &str, token: Uuid) -> Result<bool, Error> {
    let row = db
        .query_typed_one(
            "SELECT idempotency.idem_release($1, $2, $3)",
            &[(&scope, Type::TEXT), (&key, Type::TEXT), (&token, Type::UUID)],
        )
        .await?;
    Ok(row.get(0))
}

/// A live record as `idem_lookup` returns it (the columns an application reads).
#[derive(Debug, Clone)]
pub struct Record {
    pub status: String,
    pub fingerprint: Option<String>,
    pub attempts: i32,
    pub recovery_point: Option<String>,
    pub recovery_data: Option<Value>,
    pub response_status: Option<u16>,
    pub response_body: Option<Value>,
    pub lease_left: Option<Duration>,
}

/// `idem_lookup`: the live record, or None. Read-only.
pub async fn lookup(db: &impl GenericClient, scope: &str, key: &str) -> Result<Option<Record>, Error> {
    let row = db
        .query_typed_opt(
            "SELECT k.status::text, k.fingerprint, k.attempts, k.recovery_point, k.recovery_data,
                    k.response_status, k.response_body,
                    extract(epoch FROM k.locked_until - clock_timestamp())::float8
             FROM idempotency.idem_lookup($1, $2) AS k",
            &[(&scope, Type::TEXT), (&key, Type::TEXT)],
        )
        .await?;
    Ok(row.map(|r| Record {
        status: r.get(0),
        fingerprint: r.get(1),
        attempts: r.get(2),
        recovery_point: r.get(3),
        recovery_data: r.get(4),
        response_status: r.get::<_, Option<i32>>(5).map(|s| s as u16),
        response_body: r.get(6),
        lease_left: r.get::<_, Option<f64>>(7).map(|s| Duration::from_secs_f64(s.max(0.0))),
    }))
}

/// `idem_seen`: true the first time `message_id` is seen in `scope` (recorded in the caller's
/// transaction).
pub async fn seen(
    db: &impl GenericClient,
    scope: &str,
    message_id: &str,
    ttl: Option<Duration>,
) -> Result<bool, Error> {
    let ttl = interval(ttl);
    let row = db
        .query_typed_one(
            "SELECT idempotency.idem_seen($1, $2, $3::interval)",
            &[(&scope, Type::TEXT), (&message_id, Type::TEXT), (&ttl, Type::TEXT)],
        )
        .await?;
    Ok(row.get(0))
}

/// `idem_seen_many` (extension 0.4.0 and later; [`Error::Unsupported`] before).
pub async fn seen_many(
    db: &impl GenericClient,
    features: Features,
    scope: &str,
    message_ids: &[&str],
    ttl: Option<Duration>,
) -> Result<Vec<bool>, Error> {
    if !features.seen_many {
        return Err(Error::Unsupported("idem_seen_many"));
    }
    let ttl = interval(ttl);
    let row = db
        .query_typed_one(
            "SELECT idempotency.idem_seen_many($1, $2, $3::interval)",
            &[(&scope, Type::TEXT), (&message_ids, Type::TEXT_ARRAY), (&ttl, Type::TEXT)],
        )
        .await?;
    Ok(row.get(0))
}

/// `idem_fingerprint(jsonb, ignore)`: `sha256:` and the hex of the RFC 8785 form.
pub async fn fingerprint_json(
    db: &impl GenericClient,
    payload: &Value,
    ignore: &[&str],
) -> Result<String, Error> {
    let row = db
        .query_typed_one(
            "SELECT idempotency.idem_fingerprint($1, $2)",
            &[(&payload, Type::JSONB), (&ignore, Type::TEXT_ARRAY)],
        )
        .await?;
    Ok(row.get(0))
}

#[cfg(test)]
mod tests {
    use super::{claim_sql, Features};

    #[test]
    fn deferred_is_sent_only_when_asked_for_and_offered() {
        let all = Features { claim_wait_and_token: true, seen_many: true, claim_deferred: true };
        assert!(claim_sql(all, true).contains("token => $10, deferred => true) AS c"));
        assert!(!claim_sql(all, false).contains("deferred"));
        let older = Features { claim_deferred: false, ..all };
        assert!(!claim_sql(older, true).contains("deferred"));
        let first_round = Features::default();
        assert!(!claim_sql(first_round, true).contains("=>"));
    }
}
