//! The HTTP side: `POST /charges` (claim in the business transaction) and
//! `POST /charges/external` (claim committed first, then a slow external gateway), both behind
//! pg-idempotency's layer; the handlers only do the business part.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use deadpool_postgres::Pool;
use pg_idempotency::response::app_problem;
use pg_idempotency::{route_of, Disposition, Error, Idem, IdempotencyLayer, Outcome};
use serde_json::{json, Value};
use tokio_postgres::types::Type;

use crate::gateway::{Gateway, GatewayError};

#[derive(Clone)]
pub struct App(Arc<Inner>);

struct Inner {
    pool: Pool,
    gateway: Gateway,
    lease: Duration,
    allow_fault_injection: bool,
}

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

/// Under an advisory lock: services starting side by side would otherwise race on the table's
/// catalog rows (CREATE TABLE IF NOT EXISTS is not safe against itself).
const SCHEMA: &str = "\
BEGIN;
SELECT pg_advisory_xact_lock(hashtext('charges schema'));
CREATE TABLE IF NOT EXISTS charges (
    id                text PRIMARY KEY,
    tenant            text NOT NULL,
    amount            bigint NOT NULL CHECK (amount > 0),
    currency          text NOT NULL,
    gateway_charge_id text UNIQUE,
    created_at        timestamptz NOT NULL DEFAULT now()
);
COMMIT";

impl App {
    pub fn new(pool: Pool, gateway: Gateway, lease: Duration, allow_fault_injection: bool) -> App {
        App(Arc::new(Inner { pool, gateway, lease, allow_fault_injection }))
    }

    pub fn router(&self) -> Router {
        let idem = IdempotencyLayer::new(self.0.pool.clone()).scope(scope);
        Router::new()
            .route("/charges", post(post_charges).layer(idem.clone().same_transaction()))
            .route("/charges/external", post(post_charges_external).layer(idem.committed_first(self.0.lease)))
            .route("/charges/{id}", get(get_charge))
            .route("/healthz", get(|| async { "ok\n" }))
            .with_state(self.clone())
    }

    /// The extension must be there (CREATE EXTENSION needs a superuser: not the service's
    /// job); the service's own table is created when missing.
    pub async fn prepare_schema(&self) -> Result<(), String> {
        let conn = self.0.pool.get().await.map_err(|e| format!("database: {e}"))?;
        let found = conn
            .query_typed_opt("SELECT 1 FROM pg_extension WHERE extname = 'idempotency'", &[])
            .await
            .map_err(|e| format!("database: {e}"))?;
        if found.is_none() {
            return Err(
                "the idempotency extension is not installed in this database (CREATE EXTENSION idempotency)"
                    .into(),
            );
        }
        conn.batch_execute(SCHEMA).await.map_err(|e| format!("creating table charges: {e}"))
    }

    fn fault_ms(&self, headers: &HeaderMap, name: &str) -> Option<u64> {
        if !self.0.allow_fault_injection {
            return None;
        }
        headers.get(name)?.to_str().ok()?.parse().ok()
    }
}

// ---------------------------------------------------------------------------------------
// Checks: tenant (401, in the scope function: before the key and the claim), body (400)

fn tenant_of(headers: &HeaderMap) -> Result<String, Response> {
    let unauthorized = |detail: &str| {
        let mut r = app_problem(401, "Unauthorized", detail);
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("ApiKey realm=\"charges\""));
        r
    };
    let value =
        headers.get("x-api-key").ok_or_else(|| unauthorized("The request has no X-Api-Key header."))?;
    let tenant = value.to_str().map_err(|_| unauthorized("The X-Api-Key header is not valid."))?.trim();
    // In this example the API key is the tenant (account) id; a real service looks it up.
    if tenant.is_empty() || tenant.len() > 200 || !tenant.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(unauthorized("The X-Api-Key header is not valid."));
    }
    Ok(tenant.to_string())
}

/// Scope = tenant + method + route template, e.g. `acct_1:POST /charges`.
fn scope(parts: &Parts) -> Result<String, Response> {
    Ok(format!("{}:{}", tenant_of(&parts.headers)?, route_of(parts)))
}

struct Charge {
    tenant: String,
    amount: i64,
    currency: String,
}

/// A refused body: nothing was done, so the key is given back.
fn parse_charge(headers: &HeaderMap, body: &Bytes) -> Result<Charge, Response> {
    let tenant = tenant_of(headers)?;
    let invalid = |detail: &str| Disposition::Release.mark(app_problem(400, "Invalid request", detail));
    let payload: Value =
        serde_json::from_slice(body).map_err(|e| invalid(&format!("The body is not JSON: {e}.")))?;
    let amount = match &payload["amount"] {
        Value::Number(n) => {
            n.as_i64().or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9e15).map(|f| f as i64))
        }
        _ => None,
    }
    .filter(|a| *a > 0)
    .ok_or_else(|| invalid("\"amount\" must be a positive integer (minor units)."))?;
    let currency = payload["currency"]
        .as_str()
        .filter(|c| c.len() == 3 && c.bytes().all(|b| b.is_ascii_alphabetic()))
        .map(str::to_ascii_lowercase)
        .ok_or_else(|| invalid("\"currency\" must be a three-letter ISO 4217 code."))?;
    Ok(Charge { tenant, amount, currency })
}

/// The faults before the side effect (tests only): a delay, or a failure.
async fn faults_before_side_effect(app: &App, headers: &HeaderMap) -> Result<(), Response> {
    if let Some(ms) = app.fault_ms(headers, "x-fault-delay-ms") {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if app.fault_ms(headers, "x-fault-fail-before") == Some(1) {
        return Err(app_problem(500, "Injected fault", "Failed before the side effect."));
    }
    Ok(())
}

/// The charge row, written in the transaction the layer commits with the stored 201.
async fn record_charge(idem: &Idem, c: &Charge, gateway_charge_id: Option<&str>) -> Result<Response, Error> {
    let db = idem.db().await?;
    let row = db
        .query_typed_one(
            INSERT_CHARGE,
            &[
                (&c.tenant, Type::TEXT),
                (&c.amount, Type::INT8),
                (&c.currency, Type::TEXT),
                (&gateway_charge_id, Type::TEXT),
            ],
        )
        .await?;
    let (id, body): (String, String) = (row.get(0), row.get(1));
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, format!("/charges/{id}")), (header::CONTENT_TYPE, "application/json".to_owned())],
        body,
    )
        .into_response())
}

// ---------------------------------------------------------------------------------------
// POST /charges: the claim, the charge row and the stored response in one transaction.

async fn post_charges(State(app): State<App>, idem: Idem, headers: HeaderMap, body: Bytes) -> Response {
    let charge = match parse_charge(&headers, &body) {
        Ok(c) => c,
        Err(answer) => return answer,
    };
    if let Err(answer) = faults_before_side_effect(&app, &headers).await {
        return answer;
    }
    record_charge(&idem, &charge, None).await.unwrap_or_else(IntoResponse::into_response)
}

// ---------------------------------------------------------------------------------------
// POST /charges/external: claim committed first (the layer renews its lease while this runs),
// call the gateway with checkpoints before and after, then the charge row.
//
// recovery_point        recovery_data                                  a takeover does
// (none)                -                                              start from the beginning
// gateway_call_started  {gateway_key, amount, currency}                call the gateway again with the same gateway_key
// gateway_charged       {gateway_key, amount, currency, gateway_charge_id}  skip the gateway, finish

async fn post_charges_external(
    State(app): State<App>,
    idem: Idem,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let charge = match parse_charge(&headers, &body) {
        Ok(c) => c,
        Err(answer) => return answer,
    };
    match external(&app, &idem, &headers, &charge).await {
        Ok(answer) => answer,
        Err(e) => e.into_response(),
    }
}

async fn external(app: &App, idem: &Idem, headers: &HeaderMap, c: &Charge) -> Result<Response, Error> {
    let mut point = idem.recovery_point().unwrap_or_default();
    let mut data = idem.recovery_data().unwrap_or(Value::Null);
    if point.is_empty() {
        if let Err(answer) = faults_before_side_effect(app, headers).await {
            return Ok(answer);
        }
        // Choose the gateway's idempotency key and record it *before* calling, so that a
        // takeover repeats the call with the same key instead of charging again.
        data = json!({"gateway_key": format!("gk_{}", idem.token()), "amount": c.amount, "currency": c.currency});
        idem.checkpoint("gateway_call_started", Some(data.clone())).await?;
        point = "gateway_call_started".into();
    }
    if point == "gateway_call_started" {
        let gateway_key = data["gateway_key"].as_str().unwrap_or_default().to_owned();
        let amount = data["amount"].as_i64().unwrap_or(c.amount);
        let currency = data["currency"].as_str().unwrap_or(&c.currency).to_owned();
        match app.0.gateway.charge(&gateway_key, amount, &currency).await {
            Ok(a) if a.status == 200 || a.status == 201 => {
                let Some(id) = a.body["id"].as_str() else {
                    return Ok(gateway_unknown(app, "gateway answer without id"));
                };
                data["gateway_charge_id"] = json!(id);
                idem.checkpoint("gateway_charged", Some(data.clone())).await?;
                point = "gateway_charged".into();
            }
            // A decline is a final answer: stored (below 500), replayed like a success.
            Ok(a) if a.status == 402 => {
                return Ok(app_problem(402, "Payment declined", "The gateway declined the charge."))
            }
            Ok(a) => return Ok(gateway_unknown(app, &format!("the gateway answered {}", a.status))),
            Err(GatewayError::NotReached(e)) if idem.outcome() == Outcome::Claimed => {
                // The operation's first attempt, and nothing reached the gateway: give the key
                // back, the client's retry runs as new.
                log::warn!("charges-api: gateway not reached ({e}); claim released");
                let mut r =
                    app_problem(503, "Payment gateway unavailable", "Nothing was charged. Retry later.");
                r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(1));
                return Ok(Disposition::Release.mark(r));
            }
            // An earlier attempt may have reached the gateway, or this one may have: keep the
            // claim. Once its lease ends, a retry takes it over and repeats the call with the
            // same gateway key, which charges at most once.
            Err(GatewayError::NotReached(e)) | Err(GatewayError::Unknown(e)) => {
                return Ok(gateway_unknown(app, &e))
            }
        }
    }
    if point != "gateway_charged" {
        log::error!("charges-api: unknown recovery_point {point:?}");
        return Ok(app_problem(500, "Internal error", "Unknown recovery point."));
    }
    if let Some(ms) = app.fault_ms(headers, "x-fault-pause-after-gateway-ms") {
        log::warn!(
            "charges-api: fault injection: stalling {ms} ms after the gateway answered, lease not renewed"
        );
        idem.stop_renewal();
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    // idem.db() first runs a fencing checkpoint: it fails with IK002 if the claim was taken
    // over meanwhile (then nothing is written and this worker answers 409, not 201).
    record_charge(idem, c, data["gateway_charge_id"].as_str()).await
}

fn gateway_unknown(app: &App, why: &str) -> Response {
    log::warn!("charges-api: gateway outcome unknown ({why}); claim kept for a retry");
    let mut r = app_problem(502, "Payment gateway did not answer",
        "The charge may or may not have been made. Retry with the same Idempotency-Key: it will not be charged twice.",
    );
    let secs = app.0.lease.as_millis().div_ceil(1000).max(1) as u64;
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
    Disposition::Keep.mark(r)
}

// ---------------------------------------------------------------------------------------
// GET /charges/{id}

async fn get_charge(State(app): State<App>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    let tenant = match tenant_of(&headers) {
        Ok(t) => t,
        Err(answer) => return answer,
    };
    let found = async {
        let conn = app.0.pool.get().await?;
        Ok::<_, Error>(
            conn.query_typed_opt(CHARGE_AS_JSON, &[(&id, Type::TEXT), (&tenant, Type::TEXT)]).await?,
        )
    };
    match found.await {
        Ok(Some(row)) => {
            ([(header::CONTENT_TYPE, "application/json")], row.get::<_, String>(0)).into_response()
        }
        Ok(None) => app_problem(404, "Not found", "No such charge."),
        Err(e) => e.into_response(),
    }
}
