//! charges-api: an example HTTP service that makes `POST /charges` idempotent with the
//! `idempotency` PostgreSQL extension through the pg-idempotency crate (clients/rust).
//!
//! ```text
//! charges-api [--database-url URL] [--listen ADDR] [--gateway-url URL] [--lease-ms N]
//!             [--pool-size N] [--gateway-timeout-ms N] [--allow-fault-injection]
//! charges-api gateway-stub [--listen ADDR] [--delay-ms N]
//! ```
//!
//! Every option can also come from the environment: DATABASE_URL, LISTEN_ADDR, GATEWAY_URL,
//! LEASE_MS, POOL_SIZE, GATEWAY_TIMEOUT_MS, ALLOW_FAULT_INJECTION=1 (the options win).
//!
//! Routes: `POST /charges` (same transaction), `POST /charges/external` (claim committed
//! first, then the gateway), `GET /charges/{id}`, `GET /healthz`. Both POSTs take `X-Api-Key`
//! (the tenant), `Idempotency-Key` and `{"amount": 500, "currency": "eur"}`. With
//! `--allow-fault-injection` (tests only), request headers: `X-Fault-Delay-Ms: N` (sleep before
//! the side effect, lease renewed), `X-Fault-Fail-Before: 1` (fail before it: 500, key
//! released), `X-Fault-Pause-After-Gateway-Ms: N` (stall after the gateway charged, without
//! renewing the lease: a worker that hangs past its lease).

// Result<_, Response> is axum's idiom for "answer this now"; a Response is large, that is fine.
#![allow(clippy::result_large_err)]

mod api;
mod gateway;

use std::process::exit;
use std::time::Duration;

use clap::{Parser, Subcommand};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};

#[derive(Parser)]
#[command(name = "charges-api", about = "Example service: idempotent POST /charges")]
struct Options {
    #[command(subcommand)]
    command: Option<Command>,
    #[arg(long, env = "DATABASE_URL", default_value = "postgresql://postgres@127.0.0.1:5432/postgres")]
    database_url: String,
    #[arg(long, env = "LISTEN_ADDR", default_value = "127.0.0.1:8080")]
    listen: String,
    #[arg(long, env = "GATEWAY_URL", default_value = "http://127.0.0.1:8081")]
    gateway_url: String,
    /// Lease of the committed-first route, in milliseconds (renewed every third of it).
    #[arg(long, env = "LEASE_MS", default_value_t = 10000, value_parser = clap::value_parser!(u64).range(100..))]
    lease_ms: u64,
    #[arg(long, env = "POOL_SIZE", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pool_size: u32,
    #[arg(long, env = "GATEWAY_TIMEOUT_MS", default_value_t = 30000)]
    gateway_timeout_ms: u64,
    /// Honour the X-Fault-* request headers (tests only).
    #[arg(long, env = "ALLOW_FAULT_INJECTION")]
    allow_fault_injection: bool,
}

#[derive(Subcommand)]
enum Command {
    /// A stub of the payment gateway, for local runs and tests.
    GatewayStub {
        #[arg(long, env = "LISTEN_ADDR", default_value = "127.0.0.1:8081")]
        listen: String,
        #[arg(long, default_value_t = 0)]
        delay_ms: u64,
    },
}

fn die(message: &str) -> ! {
    eprintln!("charges-api: {message}");
    exit(1)
}

#[tokio::main]
async fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let o = Options::parse();
    if let Some(Command::GatewayStub { listen, delay_ms }) = o.command {
        if let Err(e) = gateway::run_stub(&listen, delay_ms).await {
            die(&format!("gateway-stub: {e}"));
        }
        return;
    }
    let db_config: tokio_postgres::Config =
        o.database_url.parse().unwrap_or_else(|e| die(&format!("--database-url: {e}")));
    let manager = Manager::from_config(
        db_config,
        tokio_postgres::NoTls,
        ManagerConfig { recycling_method: RecyclingMethod::Fast },
    );
    let pool = Pool::builder(manager)
        .max_size(o.pool_size as usize)
        .build()
        .unwrap_or_else(|e| die(&format!("pool: {e}")));
    let gateway = gateway::Gateway::new(&o.gateway_url, Duration::from_millis(o.gateway_timeout_ms))
        .unwrap_or_else(|e| die(&e));
    let app = api::App::new(pool, gateway, Duration::from_millis(o.lease_ms), o.allow_fault_injection);
    if let Err(e) = app.prepare_schema().await {
        die(&e);
    }
    let listener = tokio::net::TcpListener::bind(&o.listen)
        .await
        .unwrap_or_else(|e| die(&format!("cannot listen on {}: {e}", o.listen)));
    log::info!("charges-api listening on {}", listener.local_addr().unwrap());
    if let Err(e) = axum::serve(listener, app.router()).await {
        die(&e.to_string());
    }
}
