//! The demo app of the demo-app contract (the same routes in every language's package):
//!
//! ```text
//! cargo run --example demo -- --database-url URL --listen 127.0.0.1:8080 [--lease-ms N] [--allow-fault-injection]
//! ```
//!
//! `POST /charges` (same transaction), `POST /charges/external` (committed first),
//! `GET /charges/{id}`, `GET /healthz`. Tenant in `X-Api-Key`, body
//! `{"amount": <int > 0>, "currency": <string>}`. With `--allow-fault-injection`:
//! `X-Fault-Delay-Ms: N` sleeps before the side effect, `X-Fault-Fail-Before: 1` fails before it.

// Result<_, Response> is axum's idiom for "answer this now"; a Response is large, that is fine.
#![allow(clippy::result_large_err)]

use std::time::Duration;

use axum::extract::Path;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use clap::Parser;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use pg_idempotency::response::app_problem;
use pg_idempotency::{route_of, Disposition, Idem, IdempotencyLayer};
use serde_json::Value;
use tokio_postgres::types::Type;

#[derive(Parser)]
#[command(about = "pg-idempotency demo app (the demo-app contract)")]
struct Options {
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    #[arg(long, env = "LISTEN_ADDR", default_value = "127.0.0.1:8080")]
    listen: String,
    /// Lease of the committed-first route, in milliseconds.
    #[arg(long, default_value_t = 10000, value_parser = clap::value_parser!(u64).range(100..))]
    lease_ms: u64,
    #[arg(long, default_value_t = 16)]
    pool_size: usize,
    #[arg(long)]
    allow_fault_injection: bool,
}

// Under an advisory lock: apps starting side by side would otherwise race on the table's
// catalog rows (CREATE TABLE IF NOT EXISTS is not safe against itself).
const SCHEMA: &str = "BEGIN; SELECT pg_advisory_xact_lock(hashtext('charges schema'));
CREATE TABLE IF NOT EXISTS charges (
    id text PRIMARY KEY, tenant text NOT NULL, amount bigint NOT NULL CHECK (amount > 0),
    currency text NOT NULL, gateway_charge_id text UNIQUE, created_at timestamptz NOT NULL DEFAULT now());
COMMIT";

const INSERT: &str = "INSERT INTO charges (id, tenant, amount, currency)
    VALUES ('ch_' || replace(gen_random_uuid()::text, '-', ''), $1, $2, $3)
    RETURNING id, jsonb_build_object('id', id, 'amount', amount, 'currency', currency)::text";

#[derive(Clone, Copy)]
struct Faults(bool);

/// The tenant is the API key; none: 401 before anything is claimed.
fn tenant(headers: &HeaderMap) -> Result<String, Response> {
    match headers.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim) {
        Some(t) if !t.is_empty() => Ok(t.to_owned()),
        _ => Err(app_problem(401, "Unauthorized", "The request has no X-Api-Key header.")),
    }
}

fn scope(parts: &Parts) -> Result<String, Response> {
    Ok(format!("{}:{}", tenant(&parts.headers)?, route_of(parts)))
}

fn bad_request(detail: &str) -> Response {
    // Nothing was done: the key is given back.
    Disposition::Release.mark(app_problem(400, "Invalid request", detail))
}

async fn create_charge(
    idem: Idem,
    Extension(faults): Extension<Faults>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, pg_idempotency::Error> {
    let tenant = match tenant(&headers) {
        Ok(t) => t,
        Err(r) => return Ok(r),
    };
    let payload: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return Ok(bad_request(&format!("The body is not JSON: {e}."))),
    };
    let (Some(amount), Some(currency)) = (
        payload["amount"].as_i64().filter(|a| *a > 0),
        payload["currency"].as_str().filter(|c| !c.is_empty()),
    ) else {
        return Ok(bad_request("The body must be {\"amount\": <positive integer>, \"currency\": <string>}."));
    };
    if faults.0 {
        let fault = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if let Some(ms) = fault("x-fault-delay-ms") {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        if fault("x-fault-fail-before") == Some(1) {
            return Ok(app_problem(500, "Injected fault", "Failed before the side effect."));
        }
    }
    let db = idem.db().await?;
    let row = db
        .query_typed_one(INSERT, &[(&tenant, Type::TEXT), (&amount, Type::INT8), (&currency, Type::TEXT)])
        .await
        .map_err(pg_idempotency::Error::from)?;
    let (id, json): (String, String) = (row.get(0), row.get(1));
    Ok((
        axum::http::StatusCode::CREATED,
        [(header::LOCATION, format!("/charges/{id}")), (header::CONTENT_TYPE, "application/json".into())],
        json,
    )
        .into_response())
}

async fn get_charge(
    Extension(pool): Extension<Pool>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let tenant = match tenant(&headers) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let found = async {
        let db = pool.get().await.map_err(pg_idempotency::Error::from)?;
        db.query_typed_opt(
            "SELECT jsonb_build_object('id', id, 'amount', amount, 'currency', currency)::text
             FROM charges WHERE id = $1 AND tenant = $2",
            &[(&id, Type::TEXT), (&tenant, Type::TEXT)],
        )
        .await
        .map_err(pg_idempotency::Error::from)
    };
    match found.await {
        Ok(Some(row)) => {
            ([(header::CONTENT_TYPE, "application/json")], row.get::<_, String>(0)).into_response()
        }
        Ok(None) => app_problem(404, "Not found", "No such charge."),
        Err(e) => e.into_response(),
    }
}

#[tokio::main]
async fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let o = Options::parse();
    let pg: tokio_postgres::Config = o.database_url.parse().unwrap_or_else(|e| {
        eprintln!("demo: --database-url: {e}");
        std::process::exit(2)
    });
    let manager = Manager::from_config(
        pg,
        tokio_postgres::NoTls,
        ManagerConfig { recycling_method: RecyclingMethod::Fast },
    );
    let pool = Pool::builder(manager).max_size(o.pool_size).build().expect("pool");
    let schema = async { pool.get().await?.batch_execute(SCHEMA).await.map_err(pg_idempotency::Error::from) };
    if let Err(e) = schema.await {
        eprintln!("demo: creating table charges: {e}");
        std::process::exit(1);
    }
    let idem = IdempotencyLayer::new(pool.clone()).scope(scope);
    let app = Router::new()
        .route("/charges", post(create_charge).layer(idem.clone().same_transaction()))
        .route(
            "/charges/external",
            post(create_charge).layer(idem.committed_first(Duration::from_millis(o.lease_ms))),
        )
        .route("/charges/{id}", get(get_charge))
        .route("/healthz", get(|| async { "ok\n" }))
        .layer(Extension(pool))
        .layer(Extension(Faults(o.allow_fault_injection)));
    let listener = tokio::net::TcpListener::bind(&o.listen).await.unwrap_or_else(|e| {
        eprintln!("demo: cannot listen on {}: {e}", o.listen);
        std::process::exit(1)
    });
    log::info!("demo listening on {}", listener.local_addr().unwrap());
    axum::serve(listener, app).await.expect("server");
}
