//! bench/http.sh's axum app: `POST /charges` inserts one row and answers 201 with it.
//!
//! ```text
//! MIDDLEWARE=on|off DATABASE_URL=... POOL_SIZE=N LISTEN_ADDR=127.0.0.1:PORT bench-http-axum
//! ```
//!
//! With `MIDDLEWARE=on` the route has pg-idempotency's `IdempotencyLayer` (same transaction:
//! the row and the stored answer commit together); off, the same handler inserts on a
//! connection of the same pool. Nothing else differs.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use pg_idempotency::{Idem, IdempotencyLayer};
use serde::{Deserialize, Serialize};
use tokio_postgres::types::Type;

const INSERT: &str = "INSERT INTO charges (amount, currency) VALUES ($1, $2) RETURNING id";

#[derive(Deserialize, Serialize)]
struct Charge {
    #[serde(default)]
    id: i64,
    amount: i64,
    currency: String,
}

async fn insert(db: &tokio_postgres::Client, mut charge: Charge) -> Result<Response, pg_idempotency::Error> {
    let row =
        db.query_typed_one(INSERT, &[(&charge.amount, Type::INT8), (&charge.currency, Type::TEXT)]).await?;
    charge.id = row.get(0);
    Ok((StatusCode::CREATED, Json(charge)).into_response())
}

async fn protected(idem: Idem, Json(charge): Json<Charge>) -> Result<Response, pg_idempotency::Error> {
    insert(&*idem.db().await?, charge).await
}

async fn plain(
    State(pool): State<Pool>,
    Json(charge): Json<Charge>,
) -> Result<Response, pg_idempotency::Error> {
    insert(&**pool.get().await?, charge).await
}

#[tokio::main]
async fn main() {
    let env = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let pool_size: usize = std::env::var("POOL_SIZE").map_or(16, |s| s.parse().expect("POOL_SIZE: a number"));
    let config: tokio_postgres::Config = env("DATABASE_URL").parse().expect("DATABASE_URL");
    let manager = Manager::from_config(
        config,
        tokio_postgres::NoTls,
        ManagerConfig { recycling_method: RecyclingMethod::Fast },
    );
    let pool = Pool::builder(manager).max_size(pool_size).build().expect("pool");
    let route = match env("MIDDLEWARE").as_str() {
        "on" => post(protected).layer(IdempotencyLayer::new(pool.clone()).same_transaction()),
        "off" => post(plain),
        other => panic!("MIDDLEWARE must be on or off, not {other}"),
    };
    let app = Router::new().route("/charges", route).with_state(pool);
    let listener = tokio::net::TcpListener::bind(env("LISTEN_ADDR")).await.expect("listen");
    axum::serve(listener, app).await.expect("server");
}
