//! The README's example app: POST /orders made idempotent with axum, deadpool-postgres and
//! pg-idempotency.
//!
//!     DATABASE_URL=postgresql://app@localhost/app cargo run    # as src/main.rs of your crate
//!
//! The database needs `CREATE EXTENSION idempotency`; the app creates its table.

// Result<_, Response> is axum's idiom for "answer this now"; a Response is large, that is fine.
#![allow(clippy::result_large_err)]

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use pg_idempotency::response::app_problem;
use pg_idempotency::{route_of, Idem, IdempotencyLayer};
use serde::Deserialize;
use serde_json::json;
use tokio_postgres::types::Type;

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, tenant text NOT NULL,
    item text NOT NULL, quantity int NOT NULL)";

#[derive(Deserialize)]
struct OrderIn {
    item: String,
    quantity: i32,
}

/// Whose keys these are (one caller's key never answers another's): the API key here.
fn tenant_of(headers: &HeaderMap) -> Result<String, Response> {
    match headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        Some(key) if !key.is_empty() => Ok(key.to_owned()),
        _ => Err(app_problem(401, "Unauthorized", "Send your API key in X-Api-Key.")),
    }
}

async fn create_order(
    idem: Idem,
    headers: HeaderMap,
    Json(order): Json<OrderIn>,
) -> Result<Response, pg_idempotency::Error> {
    if order.quantity <= 0 {
        // A refusal (422): not stored, the key stays free for the corrected request.
        return Ok(app_problem(422, "Invalid order", "quantity must be positive"));
    }
    // The scope function answered 401 without an API key, so there is one here.
    let tenant = tenant_of(&headers).unwrap_or_default();
    // The key is claimed; idem.db() is the claim's transaction: the row and the stored answer
    // commit together.
    let db = idem.db().await?;
    let sql = "INSERT INTO orders (tenant, item, quantity) VALUES ($1, $2, $3) RETURNING id";
    let row = db
        .query_typed_one(
            sql,
            &[(&tenant, Type::TEXT), (&order.item, Type::TEXT), (&order.quantity, Type::INT4)],
        )
        .await?;
    let id: i64 = row.get(0);
    let body = json!({"id": id, "item": order.item, "quantity": order.quantity});
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

#[tokio::main]
async fn main() {
    // The crate logs through `log`: its warnings (the database unavailable, a claim taken over)
    // on stderr.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let listen = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".into());
    // Fast recycling sends nothing when a pooled connection is reused. The layer drops the
    // connections a database restart closed, and waits at most 1 s for one before it answers
    // 503 (IdempotencyLayer::connection_timeout), whatever the pool's own timeouts.
    let config = ManagerConfig { recycling_method: RecyclingMethod::Fast };
    let manager = Manager::from_config(url.parse().expect("DATABASE_URL"), tokio_postgres::NoTls, config);
    let pool = Pool::builder(manager).max_size(8).build().expect("pool");
    pool.get().await.expect("database").batch_execute(SCHEMA).await.expect("the orders table");
    // Same-transaction mode; scope "<API key>:POST /orders".
    let idem = IdempotencyLayer::new(pool)
        .scope(|parts| Ok(format!("{}:{}", tenant_of(&parts.headers)?, route_of(parts))));
    let app = Router::new().route("/orders", post(create_order).layer(idem));
    let listener = tokio::net::TcpListener::bind(&listen).await.expect("listen");
    axum::serve(listener, app).await.expect("server");
}
