//! The HTTP side: `POST /charges` (claim in the business transaction) and
//! `POST /charges/external` (claim committed first, then a slow external gateway).

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use tokio_postgres::GenericClient;

use crate::gateway::{Gateway, GatewayError};
use crate::idem_key;
use crate::pool::Pool;

#[derive(Clone)]
pub struct App(Arc<Inner>);

struct Inner {
    pool: Arc<Pool>,
    gateway: Gateway,
    lease: Duration,
    allow_fault_injection: bool,
}

/// A request that passed the checks that come before any claim.
struct ChargeRequest {
    tenant: String,
    key: String,
    scope: String,
    body: String,
    amount: i64,
    currency: String,
    /// Fault injection (tests only): stall this long after the gateway answered.
    pause_after_gateway: Option<Duration>,
}

/// One row of `idem_claim`.
struct Claim {
    outcome: String,
    token: Option<String>,
    response_status: Option<i32>,
    response_headers: Option<String>,
    response_body: Option<String>,
    recovery_point: Option<String>,
    recovery_data: Option<String>,
    retry_after: Option<i32>,
}

/// What can go wrong after the checks: a database error, or something else worth a 500.
enum Failure {
    Db(tokio_postgres::Error),
    Other(String),
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        Failure::Db(e)
    }
}

const CLAIM: &str = "\
SELECT c.outcome, c.token::text, c.response_status, c.response_headers::text, c.response_body::text,
       c.recovery_point, c.recovery_data::text,
       CASE WHEN c.outcome = 'in_progress'
            THEN greatest(1, ceil(extract(epoch FROM c.locked_until - clock_timestamp())))::int END
FROM idempotency.idem_claim($1, $2, idempotency.idem_fingerprint($3::text::jsonb),
                            lease => $4::text::interval) AS c";

/// Stores the response; returns the body as PostgreSQL stored it (jsonb's text form), which
/// is what a replay sends, so the first answer and every replay are byte for byte the same.
const COMPLETE: &str = "\
SELECT ($5::text::jsonb)::text
FROM idempotency.idem_complete($1, $2, $3::text::uuid, $4::int, $5::text::jsonb, $6::text::jsonb) AS done";

const CHECKPOINT: &str = "\
SELECT idempotency.idem_checkpoint($1, $2, $3::text::uuid, $4, $5::text::jsonb, $6::text::interval)";

const RELEASE: &str = "SELECT idempotency.idem_release($1, $2, $3::text::uuid)";

const INSERT_CHARGE: &str = "\
INSERT INTO charges (id, tenant, amount, currency, gateway_charge_id)
VALUES ('ch_' || replace(gen_random_uuid()::text, '-', ''), $1, $2, $3, $4)
RETURNING id, jsonb_build_object('id', id, 'object', 'charge', 'amount', amount, 'currency', currency,
                                 'gateway_charge_id', gateway_charge_id, 'status', 'succeeded',
                                 'created_at', created_at)::text";

const CHARGE_AS_JSON: &str = "\
SELECT jsonb_build_object('id', id, 'object', 'charge', 'amount', amount, 'currency', currency,
                          'gateway_charge_id', gateway_charge_id, 'status', 'succeeded',
                          'created_at', created_at)::text
FROM charges WHERE id = $1 AND tenant = $2";

const SCHEMA: &str = "\
CREATE TABLE IF NOT EXISTS charges (
    id                text PRIMARY KEY,
    tenant            text NOT NULL,
    amount            bigint NOT NULL CHECK (amount > 0),
    currency          text NOT NULL,
    gateway_charge_id text UNIQUE,
    created_at        timestamptz NOT NULL DEFAULT now()
)";

impl App {
    pub fn new(
        pool: Arc<Pool>,
        gateway: Gateway,
        lease: Duration,
        allow_fault_injection: bool,
    ) -> App {
        App(Arc::new(Inner {
            pool,
            gateway,
            lease,
            allow_fault_injection,
        }))
    }

    pub fn router(&self) -> Router {
        Router::new()
            .route("/charges", post(post_charges))
            .route("/charges/external", post(post_charges_external))
            .route("/charges/{id}", get(get_charge))
            .route("/healthz", get(|| async { "ok\n" }))
            .with_state(self.clone())
    }

    /// The extension must be there (CREATE EXTENSION needs a superuser: not the service's
    /// job); the service's own table is created when missing.
    pub async fn prepare_schema(&self) -> Result<(), String> {
        let conn = self
            .0
            .pool
            .get()
            .await
            .map_err(|e| format!("database: {e}"))?;
        let found = conn
            .query_opt(
                "SELECT 1 FROM pg_extension WHERE extname = 'idempotency'",
                &[],
            )
            .await
            .map_err(|e| format!("database: {e}"))?;
        if found.is_none() {
            return Err("the idempotency extension is not installed in this database (CREATE EXTENSION idempotency)".into());
        }
        conn.batch_execute(SCHEMA)
            .await
            .map_err(|e| format!("creating table charges: {e}"))
    }

    fn lease_sql(&self) -> String {
        format!("{} milliseconds", self.0.lease.as_millis())
    }

    fn lease_secs(&self) -> u64 {
        self.0.lease.as_millis().div_ceil(1000).max(1) as u64
    }
}

// ---------------------------------------------------------------------------------------
// Responses

/// An RFC 9457 problem.
fn problem(status: u16, slug: &str, title: &str, detail: &str) -> Response {
    let body = problem_body(status, slug, title, detail);
    let mut r = response(status, "application/problem+json", body);
    if status == 401 {
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("ApiKey realm=\"charges\""),
        );
    }
    r
}

fn problem_body(status: u16, slug: &str, title: &str, detail: &str) -> String {
    json!({
        "type": format!("https://example.com/problems/{slug}"),
        "title": title,
        "status": status,
        "detail": detail,
    })
    .to_string()
}

fn response(status: u16, content_type: &'static str, body: String) -> Response {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .body(Body::from(body))
        .unwrap()
}

fn with_retry_after(mut r: Response, secs: u64) -> Response {
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    r
}

/// A response about to be stored with idem_complete and sent: the stored headers are the
/// meaningful ones (Location, Content-Type), so a replay can send them again.
fn stored_response(status: u16, headers: &Value, body: &str) -> Response {
    let mut r = Response::builder()
        .status(status)
        .body(Body::from(body.to_string()))
        .unwrap();
    if let Some(map) = headers.as_object() {
        for (name, value) in map {
            if let (Ok(n), Some(Ok(v))) = (
                HeaderName::from_bytes(name.as_bytes()),
                value.as_str().map(HeaderValue::from_str),
            ) {
                r.headers_mut().insert(n, v);
            }
        }
    }
    r
}

/// The answers to `replay`, `in_progress` and `mismatch`: nothing runs.
fn answer_without_work(c: &Claim) -> Response {
    match c.outcome.as_str() {
        "replay" => {
            let headers: Value =
                c.response_headers.as_deref().and_then(|h| serde_json::from_str(h).ok()).unwrap_or(Value::Null);
            let status = c.response_status.unwrap_or(500) as u16;
            let mut r = stored_response(status, &headers, c.response_body.as_deref().unwrap_or(""));
            r.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
            r
        }
        "in_progress" => with_retry_after(
            problem(
                409,
                "idempotency-key-in-progress",
                "A request is outstanding for this Idempotency-Key",
                "The first request with this Idempotency-Key is still being processed. Retry later.",
            ),
            c.retry_after.unwrap_or(1).max(1) as u64,
        ),
        "mismatch" => problem(
            422,
            "idempotency-key-reused",
            "Idempotency-Key is already used",
            "This Idempotency-Key was used with a different request payload. Use a new key for a new request.",
        ),
        other => problem(500, "internal", "Internal error", &format!("unexpected claim outcome {other:?}")),
    }
}

fn failure_response(what: &str, f: Failure) -> Response {
    let e = match f {
        Failure::Db(e) => e,
        Failure::Other(message) => {
            eprintln!("charges-api: {what}: {message}");
            return problem(
                500,
                "internal",
                "Internal error",
                "The request failed; it was not carried out.",
            );
        }
    };
    let code = e.code().map(|c| c.code().to_string()).unwrap_or_default();
    match code.as_str() {
        // The claim was taken over (its lease ended) or dropped meanwhile: this worker must not
        // report success. Whoever owns it now finishes; the client's retry gets that answer.
        "IK002" | "IK001" => with_retry_after(
            problem(
                409,
                "idempotency-key-superseded",
                "A request is outstanding for this Idempotency-Key",
                "This attempt lost its claim on the Idempotency-Key to a later one. Retry to get the result.",
            ),
            1,
        ),
        // lock_timeout behind another transaction's claim, or a serialization failure / deadlock:
        // nothing was written, a retry is safe.
        "55P03" | "40001" | "40P01" => with_retry_after(
            problem(
                409,
                "idempotency-key-in-progress",
                "A request is outstanding for this Idempotency-Key",
                "Another request with this Idempotency-Key is being processed. Retry later.",
            ),
            1,
        ),
        _ => {
            eprintln!("charges-api: {what}: {e} {code}");
            problem(500, "internal", "Internal error", "The request failed; it was not carried out.")
        }
    }
}

// ---------------------------------------------------------------------------------------
// Checks before the claim: tenant (401), Idempotency-Key (400), body (400)

fn tenant_of(headers: &HeaderMap) -> Result<String, Response> {
    let unauthorized = |detail: &str| problem(401, "unauthorized", "Unauthorized", detail);
    let value = headers
        .get("x-api-key")
        .ok_or_else(|| unauthorized("The request has no X-Api-Key header."))?;
    let tenant = value
        .to_str()
        .map_err(|_| unauthorized("The X-Api-Key header is not valid."))?
        .trim();
    // In this example the API key is the tenant (account) id; a real service looks it up.
    if tenant.is_empty() || tenant.len() > 200 || !tenant.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(unauthorized("The X-Api-Key header is not valid."));
    }
    Ok(tenant.to_string())
}

impl App {
    fn check(
        &self,
        headers: &HeaderMap,
        body: &Bytes,
        route: &str,
    ) -> Result<ChargeRequest, Response> {
        let tenant = tenant_of(headers)?;
        let values: Vec<&[u8]> = headers
            .get_all("idempotency-key")
            .iter()
            .map(|v| v.as_bytes())
            .collect();
        let key = idem_key::parse(&values).map_err(|detail| {
            let title = if values.is_empty() {
                "Idempotency-Key is missing"
            } else {
                "Idempotency-Key is malformed"
            };
            problem(
                400,
                "idempotency-key-invalid",
                title,
                &format!("This operation requires a valid Idempotency-Key: {detail}."),
            )
        })?;
        let invalid = |detail: &str| problem(400, "invalid-request", "Invalid request", detail);
        let payload: Value = serde_json::from_slice(body)
            .map_err(|e| invalid(&format!("The body is not JSON: {e}.")))?;
        let amount = match &payload["amount"] {
            Value::Number(n) => n.as_i64().or_else(|| {
                n.as_f64()
                    .filter(|f| f.fract() == 0.0 && f.abs() < 9e15)
                    .map(|f| f as i64)
            }),
            _ => None,
        }
        .filter(|a| *a > 0)
        .ok_or_else(|| invalid("\"amount\" must be a positive integer (minor units)."))?;
        let currency = payload["currency"]
            .as_str()
            .filter(|c| c.len() == 3 && c.bytes().all(|b| b.is_ascii_alphabetic()))
            .map(str::to_ascii_lowercase)
            .ok_or_else(|| invalid("\"currency\" must be a three-letter ISO 4217 code."))?;
        let pause_after_gateway = if self.0.allow_fault_injection {
            headers
                .get("x-fault-pause-after-gateway-ms")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .map(Duration::from_millis)
        } else {
            None
        };
        Ok(ChargeRequest {
            scope: format!("{tenant}:POST {route}"),
            tenant,
            key,
            // Valid UTF-8: it parsed as JSON.
            body: String::from_utf8_lossy(body).into_owned(),
            amount,
            currency,
            pause_after_gateway,
        })
    }
}

async fn claim(
    db: &impl GenericClient,
    r: &ChargeRequest,
    lease: Option<&str>,
) -> Result<Claim, tokio_postgres::Error> {
    let row = db
        .query_one(CLAIM, &[&r.scope, &r.key, &r.body, &lease])
        .await?;
    let c = Claim {
        outcome: row.get(0),
        token: row.get(1),
        response_status: row.get(2),
        response_headers: row.get(3),
        response_body: row.get(4),
        recovery_point: row.get(5),
        recovery_data: row.get(6),
        retry_after: row.get(7),
    };
    eprintln!(
        "charges-api: {} key={:?} outcome={}",
        r.scope, r.key, c.outcome
    );
    Ok(c)
}

/// Runs the handler's work in a task of its own: if the client goes away mid-request, the
/// work still finishes and stores its response, which the client's retry then gets.
async fn detached<F>(what: &'static str, work: F) -> Response
where
    F: std::future::Future<Output = Result<Response, Failure>> + Send + 'static,
{
    match tokio::spawn(work).await {
        Ok(Ok(r)) => r,
        Ok(Err(f)) => failure_response(what, f),
        Err(e) => failure_response(what, Failure::Other(format!("task failed: {e}"))),
    }
}

// ---------------------------------------------------------------------------------------
// POST /charges: the claim, the charge row and the stored response in one transaction.

async fn post_charges(State(app): State<App>, headers: HeaderMap, body: Bytes) -> Response {
    let r = match app.check(&headers, &body, "/charges") {
        Ok(r) => r,
        Err(answer) => return answer,
    };
    detached(
        "POST /charges",
        async move { same_transaction(app, r).await },
    )
    .await
}

async fn same_transaction(app: App, r: ChargeRequest) -> Result<Response, Failure> {
    let mut conn = app.0.pool.get().await?;
    let tx = conn.transaction().await?;
    // A duplicate whose first request is still in its transaction waits here, then gets
    // `replay` (it committed) or `claimed` (it rolled back).
    let c = claim(&tx, &r, None).await?;
    let token = match c.outcome.as_str() {
        "claimed" | "reclaimed" => c
            .token
            .clone()
            .ok_or_else(|| Failure::Other("claim without token".into()))?,
        _ => {
            tx.rollback().await?; // the claim wrote nothing
            return Ok(answer_without_work(&c));
        }
    };
    record_charge(tx, &r, &token, None).await
}

/// The charge row and its stored 201 response, written in `tx` (fenced by the claim's token),
/// then COMMIT: how both endpoints finish a charge.
async fn record_charge(
    tx: tokio_postgres::Transaction<'_>,
    r: &ChargeRequest,
    token: &str,
    gateway_charge_id: Option<&str>,
) -> Result<Response, Failure> {
    let row = tx
        .query_one(
            INSERT_CHARGE,
            &[&r.tenant, &r.amount, &r.currency, &gateway_charge_id],
        )
        .await?;
    let (id, body): (String, String) = (row.get(0), row.get(1));
    let headers = json!({"Location": format!("/charges/{id}"), "Content-Type": "application/json"});
    let stored: String = tx
        .query_one(
            COMPLETE,
            &[
                &r.scope,
                &r.key,
                &token,
                &201i32,
                &body,
                &headers.to_string(),
            ],
        )
        .await?
        .get(0);
    tx.commit().await?;
    Ok(stored_response(201, &headers, &stored))
}

// ---------------------------------------------------------------------------------------
// POST /charges/external: claim committed first with a short lease, call the gateway with a
// heartbeat, checkpoint before and after, then the charge row and idem_complete together.
//
// recovery_point        recovery_data                                  a takeover does
// (none)                -                                              start from the beginning
// gateway_call_started  {gateway_key, amount, currency}                call the gateway again with the same gateway_key
// gateway_charged       {gateway_key, amount, currency, gateway_charge_id}  skip the gateway, finish

async fn post_charges_external(
    State(app): State<App>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let r = match app.check(&headers, &body, "/charges/external") {
        Ok(r) => r,
        Err(answer) => return answer,
    };
    detached("POST /charges/external", async move {
        committed_first(app, r).await
    })
    .await
}

async fn committed_first(app: App, r: ChargeRequest) -> Result<Response, Failure> {
    let lease = app.lease_sql();
    let mut conn = app.0.pool.get().await?;
    // Autocommit: the claim is committed at once, so duplicates get 409 straight away.
    let c = claim(&*conn, &r, Some(&lease)).await?;
    let token = match c.outcome.as_str() {
        "claimed" | "reclaimed" => c
            .token
            .clone()
            .ok_or_else(|| Failure::Other("claim without token".into()))?,
        _ => return Ok(answer_without_work(&c)),
    };
    let fresh = c.outcome == "claimed";
    let mut point = c.recovery_point.clone().unwrap_or_default();
    let mut data: Value = match c.recovery_data.as_deref() {
        Some(d) => {
            serde_json::from_str(d).map_err(|e| Failure::Other(format!("recovery_data: {e}")))?
        }
        None => Value::Null,
    };
    let checkpoint = |point: &'static str, data: String| {
        let (conn, r, token, lease) = (&conn, &r, &token, &lease);
        async move {
            conn.execute(CHECKPOINT, &[&r.scope, &r.key, token, &point, &data, lease])
                .await?;
            Ok::<(), Failure>(())
        }
    };

    if point.is_empty() {
        // Nothing has been sent to the gateway under this operation. Choose the gateway's
        // idempotency key and record it *before* calling, so that a takeover repeats the call
        // with the same key instead of charging again.
        data = json!({"gateway_key": format!("gk_{token}"), "amount": r.amount, "currency": r.currency});
        checkpoint("gateway_call_started", data.to_string()).await?;
        point = "gateway_call_started".into();
    }

    if point == "gateway_call_started" {
        let gateway_key = data["gateway_key"].as_str().unwrap_or_default().to_string();
        let (amount, currency) = (
            data["amount"].as_i64().unwrap_or(r.amount),
            data["currency"].as_str().unwrap_or(&r.currency).to_string(),
        );
        let call = app.0.gateway.charge(&gateway_key, amount, &currency);
        // While the gateway works, renew the lease: a live worker keeps its claim however slow
        // the gateway is; a dead one stops renewing and its claim can be taken over.
        let heartbeat = async {
            let every = (app.0.lease / 3).max(Duration::from_millis(50));
            loop {
                tokio::time::sleep(every).await;
                checkpoint("gateway_call_started", data.to_string()).await?;
            }
        };
        let answer = tokio::select! {
            answer = call => answer,
            lost = heartbeat => return lost,
        };
        match answer {
            Ok(a) if a.status == 200 || a.status == 201 => {
                let id = a.body["id"]
                    .as_str()
                    .ok_or_else(|| Failure::Other("gateway answer without id".into()))?;
                data["gateway_charge_id"] = json!(id);
                checkpoint("gateway_charged", data.to_string()).await?;
                point = "gateway_charged".into();
            }
            Ok(a) if a.status == 402 => {
                // A decline is a final answer: store it, it is replayed like a success.
                let body = problem_body(
                    402,
                    "card-declined",
                    "Payment declined",
                    "The gateway declined the charge.",
                );
                let headers = json!({"Content-Type": "application/problem+json"});
                let stored: String = conn
                    .query_one(
                        COMPLETE,
                        &[
                            &r.scope,
                            &r.key,
                            &token,
                            &402i32,
                            &body,
                            &headers.to_string(),
                        ],
                    )
                    .await?
                    .get(0);
                return Ok(stored_response(402, &headers, &stored));
            }
            Ok(a) => {
                return Ok(gateway_unknown(
                    &app,
                    &format!("the gateway answered {}", a.status),
                ))
            }
            Err(GatewayError::NotReached(e)) if fresh => {
                // This is the operation's first attempt and nothing reached the gateway: give
                // the key back, the client's retry runs as new.
                conn.execute(RELEASE, &[&r.scope, &r.key, &token]).await?;
                eprintln!("charges-api: gateway not reached ({e}); claim released");
                return Ok(with_retry_after(
                    problem(
                        503,
                        "gateway-unavailable",
                        "Payment gateway unavailable",
                        "Nothing was charged. Retry later.",
                    ),
                    1,
                ));
            }
            // An earlier attempt may have reached the gateway, or this one may have: keep the
            // claim. Once its lease ends, a retry takes it over and repeats the call with the
            // same gateway key, which charges at most once.
            Err(GatewayError::NotReached(e)) | Err(GatewayError::Unknown(e)) => {
                return Ok(gateway_unknown(&app, &e))
            }
        }
    }

    if point != "gateway_charged" {
        return Err(Failure::Other(format!("unknown recovery_point {point:?}")));
    }
    if let Some(pause) = r.pause_after_gateway {
        eprintln!("charges-api: fault injection: stalling {pause:?} after the gateway answered");
        tokio::time::sleep(pause).await;
    }
    let gateway_charge_id = data["gateway_charge_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // The charge row and the stored response commit together, fenced by the token. The
    // checkpoint comes first: it fails with IK002 if the claim was taken over meanwhile (then
    // nothing is written and this worker must not report success), and otherwise holds the
    // record's row lock until COMMIT, so no takeover can slip in before idem_complete.
    let tx = conn.transaction().await?;
    tx.execute(
        CHECKPOINT,
        &[
            &r.scope,
            &r.key,
            &token,
            &"completing",
            &data.to_string(),
            &lease,
        ],
    )
    .await?;
    record_charge(tx, &r, &token, Some(&gateway_charge_id)).await
}

fn gateway_unknown(app: &App, why: &str) -> Response {
    eprintln!("charges-api: gateway outcome unknown ({why}); claim kept for a retry");
    with_retry_after(
        problem(
            502,
            "gateway-outcome-unknown",
            "Payment gateway did not answer",
            "The charge may or may not have been made. Retry with the same Idempotency-Key: it will not be charged twice.",
        ),
        app.lease_secs(),
    )
}

// ---------------------------------------------------------------------------------------
// GET /charges/{id}

async fn get_charge(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let tenant = match tenant_of(&headers) {
        Ok(t) => t,
        Err(answer) => return answer,
    };
    let work = async move {
        let conn = app.0.pool.get().await?;
        Ok(
            match conn.query_opt(CHARGE_AS_JSON, &[&id, &tenant]).await? {
                Some(row) => response(200, "application/json", row.get(0)),
                None => problem(404, "not-found", "Not found", "No such charge."),
            },
        )
    };
    match work.await {
        Ok(r) => r,
        Err(f) => failure_response("GET /charges/{id}", f),
    }
}
